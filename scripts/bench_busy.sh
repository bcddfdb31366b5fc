#!/usr/bin/env bash
# bench_busy.sh: the step time of the bench models with and without another busy process on the machine
# (flowrun time; the busy process is a 1-thread gpt-tiny `flowrun time` of its own): at 1 thread, at 2
# threads fixed and at 2 threads adaptive (train.adapt_threads). The conditions alternate round by round so
# that drift in the machine's speed hits them alike; prints a markdown table (median of the rounds' medians,
# the busy 2-thread runs with their p90) and keeps the raw JSON lines in bench-results/<date>-busy/.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/bench_busy.sh [options]

  --models LIST     Comma-separated bench models, configs/bench/NAME.yaml (default: mlp,cnn,resnet,gpt_tiny)
  --threads N       The team size compared with 1 thread (default: 2)
  --rounds N        Alternating rounds (default: 3)
  --steps LIST      Timed steps per model, comma-separated in --models order (default: 1000,300,100,100)
  --build-dir DIR   Where flowrun is built (default: build; built by scripts/setup.sh if missing)
  --help            Show this help and exit
USAGE
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODELS=mlp,cnn,resnet,gpt_tiny THREADS=2 ROUNDS=3 STEPS=1000,300,100,100 BUILD_DIR=build
need_value() { [[ $# -ge 2 && -n "$2" ]] || { echo "error: $1 requires a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) need_value "$@"; MODELS=$2; shift 2 ;;
    --threads) need_value "$@"; THREADS=$2; shift 2 ;;
    --rounds) need_value "$@"; ROUNDS=$2; shift 2 ;;
    --steps) need_value "$@"; STEPS=$2; shift 2 ;;
    --build-dir) need_value "$@"; BUILD_DIR=$2; shift 2 ;;
    --help|-h) usage; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in THREADS ROUNDS; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "error: --${v,,} must be a positive integer (got '${!v}')" >&2; exit 2; }
done
IFS=, read -r -a models <<<"$MODELS"
IFS=, read -r -a steps <<<"$STEPS"
((${#steps[@]} >= ${#models[@]})) || { echo "error: --steps names ${#steps[@]} counts for ${#models[@]} models" >&2; exit 2; }
for m in "${models[@]}"; do
  [[ -f "configs/bench/$m.yaml" ]] || { echo "error: no bench model configs/bench/$m.yaml (--models)" >&2; exit 2; }
done
FLOWRUN="$BUILD_DIR/apps/flowrun"
[[ -x "$FLOWRUN" ]] || scripts/setup.sh --build-dir "$BUILD_DIR"

OUT="bench-results/$(date +%Y%m%d-%H%M%S)-busy"
mkdir -p "$OUT"
BUSY_PID=""
stop_busy() {
  if [[ -n "$BUSY_PID" ]]; then
    kill "$BUSY_PID" 2>/dev/null || true
    wait "$BUSY_PID" 2>/dev/null || true
    BUSY_PID=""
  fi
}
trap stop_busy EXIT
start_busy() {
  "$FLOWRUN" time configs/bench/gpt_tiny.yaml --steps 1000000 --profile 0 --set train.threads=1 \
    --set train.adapt_threads=false >/dev/null 2>&1 &
  BUSY_PID=$!
  sleep 2  # past its start-up, into its steps
}

# condition name, thread count, adaptive
conditions=("alone-1 1 false" "alone-fixed $THREADS false" "alone-adaptive $THREADS true"
  "busy-1 1 false" "busy-fixed $THREADS false" "busy-adaptive $THREADS true")
for ((r = 1; r <= ROUNDS; r++)); do
  for i in "${!models[@]}"; do
    m=${models[$i]}
    for c in "${conditions[@]}"; do
      read -r name threads adaptive <<<"$c"
      [[ $name == busy-* ]] && start_busy
      echo "round $r/$ROUNDS: $m $name" >&2
      "$FLOWRUN" time "configs/bench/$m.yaml" --steps "${steps[$i]}" --profile 0 --json \
        --set train.threads="$threads" --set train.adapt_threads="$adaptive" 2>/dev/null |
        tail -1 >>"$OUT/$m-$name.jsonl"
      stop_busy
    done
  done
done

field() { grep -o "\"$2\": [0-9.e+-]*" "$1" | awk '{print $2}' || true; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ms() { field "$OUT/$1-$2.jsonl" "${3:-median_step_ms}" | median; }

cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
echo "Median step (ms) of flowrun time, median of $ROUNDS alternating rounds; busy: beside a 1-thread gpt-tiny"
echo "flowrun time; $(date +%Y-%m-%d), $cpu, $(nproc) CPUs, flowrun $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
echo "| model | alone, 1 thread | alone, $THREADS fixed | alone, $THREADS adaptive | busy, 1 thread | busy, $THREADS fixed (p90) | busy, $THREADS adaptive (p90) | busy adaptive / busy 1 |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for m in "${models[@]}"; do
  awk -v m="$m" -v a1="$(ms "$m" alone-1)" -v af="$(ms "$m" alone-fixed)" -v aa="$(ms "$m" alone-adaptive)" \
    -v b1="$(ms "$m" busy-1)" -v bf="$(ms "$m" busy-fixed)" -v bfp="$(ms "$m" busy-fixed p90_step_ms)" \
    -v ba="$(ms "$m" busy-adaptive)" -v bap="$(ms "$m" busy-adaptive p90_step_ms)" 'BEGIN {
      printf "| %s | %.2f | %.2f | %.2f | %.2f | %.2f (%.1f) | %.2f (%.1f) | %.2fx |\n", m, a1, af, aa, b1, bf, bfp, ba, bap, ba / b1
    }'
done
echo
echo "raw: $OUT/"

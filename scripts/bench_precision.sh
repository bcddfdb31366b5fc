#!/usr/bin/env bash
# bench_precision.sh: step time of one config in fp32, bf16 and fp16 (flowrun time), alternating the dtypes
# round by round so that drift in the machine's speed hits them alike; prints a markdown table (median of
# the rounds' medians) and keeps the raw JSON lines in bench-results/<date>-precision/.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/bench_precision.sh [options]

  --config FILE     Config to time (default: configs/bench/gpt_tiny.yaml)
  --dtypes LIST     Comma-separated precision.dtype values (default: fp32,bf16,fp16)
  --threads N       train.threads (default: 2)
  --rounds N        Alternating rounds (default: 3)
  --steps N         Timed steps per run (default: 20)
  --warmup N        Untimed steps per run (default: 5)
  --build-dir DIR   Where flowrun is built (default: build; built by scripts/setup.sh if missing)
  --help            Show this help and exit
USAGE
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CONFIG=configs/bench/gpt_tiny.yaml DTYPES=fp32,bf16,fp16 THREADS=2 ROUNDS=3 STEPS=20 WARMUP=5 BUILD_DIR=build
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) CONFIG=$2; shift 2 ;;
    --dtypes) DTYPES=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --help|-h) usage; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -f "$CONFIG" ]] || { echo "error: config $CONFIG not found" >&2; exit 2; }
FLOWRUN="$BUILD_DIR/apps/flowrun"
[[ -x "$FLOWRUN" ]] || scripts/setup.sh --build-dir "$BUILD_DIR"

OUT="bench-results/$(date +%Y%m%d-%H%M%S)-precision"
mkdir -p "$OUT"
IFS=, read -r -a dtypes <<<"$DTYPES"
for ((r = 1; r <= ROUNDS; r++)); do
  for d in "${dtypes[@]}"; do
    echo "round $r/$ROUNDS: $d" >&2
    "$FLOWRUN" time "$CONFIG" --steps "$STEPS" --warmup "$WARMUP" --profile 0 --json \
      --set precision.dtype="$d" --set train.threads="$THREADS" 2>/dev/null | tail -1 >>"$OUT/$d.jsonl"
  done
done

field() { grep -o "\"$2\": [0-9.e+-]*" "$1" | awk '{print $2}' || true; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
echo "$CONFIG, $THREADS threads, $STEPS timed steps after $WARMUP, median of $ROUNDS alternating rounds;"
echo "$(date +%Y-%m-%d), $cpu, flowrun $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
echo "| dtype | step ms | vs fp32 | tokens or samples/s | GFLOP/s | arena MiB | peak RSS MiB |"
echo "|---|---:|---:|---:|---:|---:|---:|"
base=""
for d in "${dtypes[@]}"; do
  f="$OUT/$d.jsonl"
  ms=$(field "$f" median_step_ms | median)
  [[ -z "$base" && "$d" == fp32 ]] && base=$ms
  per_step=$(field "$f" tokens_per_step | head -1)
  [[ -z "$per_step" ]] && per_step=$(field "$f" samples_per_step | head -1)
  flops=$(field "$f" flops_per_step | head -1)
  awk -v d="$d" -v ms="$ms" -v base="$base" -v n="${per_step:-0}" -v fl="$flops" \
    -v arena="$(field "$f" arena_mib | median)" -v rss="$(field "$f" peak_rss_mib | median)" 'BEGIN {
      ratio = base != "" ? sprintf("%.2fx", ms / base) : "-"
      printf "| %s | %.1f | %s | %.0f | %.0f | %.1f | %.0f |\n", d, ms, ratio, n / ms * 1000, fl / ms / 1e6, arena, rss
    }'
done
echo
echo "raw: $OUT/"

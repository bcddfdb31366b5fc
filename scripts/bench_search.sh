#!/usr/bin/env bash
# bench_search.sh: how well `flowrun plan --machine` ranks layouts. Calibrates this machine on N ranks
# (`flowrun calibrate` under mpirun), predicts the step time of each layout of a config on N ranks, measures
# it (`flowrun time` under mpirun, the layouts alternating round by round), and prints both with their ranks
# and Spearman's rank correlation. Raw output in bench-results/<date>-search/.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/bench_search.sh [options]

  --config FILE     Config (default: configs/bench/gpt_tiny.yaml)
  --ranks N         MPI ranks (default: 2; the layouts below are for 2)
  --threads N       train.threads per rank (default: 1)
  --rounds N        Alternating rounds (default: 3)
  --steps N         Timed steps per run (default: 10)
  --machine FILE    Use this profile instead of calibrating
  --build-dir DIR   Where flowrun is built (default: build)
  --help            Show this help and exit
USAGE
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CONFIG=configs/bench/gpt_tiny.yaml RANKS=2 THREADS=1 ROUNDS=3 STEPS=10 MACHINE="" BUILD_DIR=build
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) CONFIG=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --machine) MACHINE=$2; shift 2 ;;
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --help|-h) usage; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -f "$CONFIG" ]] || { echo "error: config $CONFIG not found" >&2; exit 2; }
FLOWRUN="$BUILD_DIR/apps/flowrun"
[[ -x "$FLOWRUN" ]] || { echo "error: $FLOWRUN not built (scripts/setup.sh)" >&2; exit 2; }
OUT="bench-results/$(date +%Y%m%d-%H%M%S)-search"
mkdir -p "$OUT"
MPI=(mpirun -np "$RANKS")
[[ $(id -u) -eq 0 ]] && MPI+=(--allow-run-as-root --oversubscribe)

if [[ -z "$MACHINE" ]]; then
  MACHINE="$OUT/machine.yaml"
  "${MPI[@]}" "$FLOWRUN" calibrate --threads "$THREADS" --out "$MACHINE" >"$OUT/calibrate.log"
fi

# name|overrides: data, tensor and pipeline parallelism, ZeRO 0-3, recompute, 2 and 8 pipeline micro-batches.
LAYOUTS=(
  "DP2 ZeRO-0|parallel.data=2"
  "DP2 ZeRO-1|parallel.data=2 parallel.zero=1"
  "DP2 ZeRO-2|parallel.data=2 parallel.zero=2"
  "DP2 ZeRO-3|parallel.data=2 parallel.zero=3"
  "DP2 ZeRO-1 recompute|parallel.data=2 parallel.zero=1 train.recompute=blocks"
  "DP2 ZeRO-3 recompute|parallel.data=2 parallel.zero=3 train.recompute=blocks"
  "TP2|parallel.tensor=2"
  "TP2 recompute|parallel.tensor=2 train.recompute=blocks"
  "PP2, 2 micro-batches|parallel.pipeline=2 parallel.micro_batches=2"
  "PP2, 8 micro-batches|parallel.pipeline=2 parallel.micro_batches=8"
)
sets() { local s; for s in $1; do printf -- '--set %s ' "$s"; done; printf -- '--set train.threads=%s' "$THREADS"; }
field() { grep -o "\"$1\": [0-9.e+-]*" | head -1 | awk '{print $2}'; }

for i in "${!LAYOUTS[@]}"; do
  IFS='|' read -r _ over <<<"${LAYOUTS[$i]}"
  # shellcheck disable=SC2046
  "$FLOWRUN" plan "$CONFIG" --world-size "$RANKS" $(sets "$over") --machine "$MACHINE" --json |
    tail -1 | field predicted_step_ms >"$OUT/predicted.$i"
done
for ((r = 1; r <= ROUNDS; r++)); do
  for i in "${!LAYOUTS[@]}"; do
    IFS='|' read -r name over <<<"${LAYOUTS[$i]}"
    echo "round $r: $name" >&2
    # shellcheck disable=SC2046
    "${MPI[@]}" "$FLOWRUN" time "$CONFIG" $(sets "$over") --steps "$STEPS" --warmup 2 --profile 0 --json \
      >"$OUT/time.$i.$r.log" 2>&1
    grep -o '{"config".*' "$OUT/time.$i.$r.log" | head -1 | field median_step_ms >>"$OUT/measured.$i"
  done
done

# The median of the rounds' medians, then ranks (1 = fastest; ties share the mean rank) and Spearman's rho.
for i in "${!LAYOUTS[@]}"; do
  IFS='|' read -r name _ <<<"${LAYOUTS[$i]}"
  printf '%s\t%s\t%s\n' "$name" "$(cat "$OUT/predicted.$i")" "$(sort -g "$OUT/measured.$i" | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')"
done >"$OUT/table.tsv"
python3 - "$OUT/table.tsv" "$MACHINE" "$CONFIG" "$RANKS" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r
pred = [float(r[1]) for r in rows]
meas = [float(r[2]) for r in rows]
rp, rm = ranks(pred), ranks(meas)
n = len(rows)
mp, mm = sum(rp) / n, sum(rm) / n
cov = sum((a - mp) * (b - mm) for a, b in zip(rp, rm))
rho = cov / (sum((a - mp) ** 2 for a in rp) * sum((b - mm) ** 2 for b in rm)) ** 0.5
print(f"{sys.argv[3]} on {sys.argv[4]} ranks, profile {sys.argv[2]}\n")
print("| layout | predicted | rank | measured (median of rounds) | rank |")
print("|---|---:|---:|---:|---:|")
for r, a, b in zip(rows, rp, rm):
    print(f"| {r[0]} | {float(r[1]):.1f} ms | {a:g} | {float(r[2]):.1f} ms | {b:g} |")
print(f"\nSpearman's rank correlation: {rho:.3f}")
PY

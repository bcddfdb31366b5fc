#!/usr/bin/env bash
# bench_checkpoint.sh: how long checkpointing blocks the step loop, asynchronous (snapshot copy, write in a
# background thread) versus synchronous (the whole write), on one config; from the checkpoint records
# ("blocked_s", "write_s") that training writes to metrics.jsonl.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/bench_checkpoint.sh [--config FILE] [--steps N] [--every N] [--build-dir DIR]

  --config FILE     Config to train (default: configs/kjv_gpt.yaml)
  --steps N         Steps per run (default: 60)
  --every N         train.checkpoint_every (default: 10)
  --build-dir DIR   Where flowrun is built (default: build)
USAGE
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CONFIG=configs/kjv_gpt.yaml STEPS=60 EVERY=10 BUILD_DIR=build
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) CONFIG=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --every) EVERY=$2; shift 2 ;;
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --help|-h) usage; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
FLOWRUN="$BUILD_DIR/apps/flowrun"
[[ -x "$FLOWRUN" ]] || scripts/setup.sh --build-dir "$BUILD_DIR"
OUT="$(mktemp -d "${TMPDIR:-/tmp}/flowrun-bench-ckpt.XXXXXX")"
trap 'rm -rf "$OUT"' EXIT

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
field() { grep '"checkpoint"' "$1" | grep -o "\"$2\": [0-9.e+-]*" | awk '{print $2}'; }

for mode in false true; do
  "$FLOWRUN" train "$CONFIG" --run-dir "$OUT/$mode" --no-progress --set train.steps="$STEPS" \
    --set train.checkpoint_every="$EVERY" --set train.eval_every=0 --set schedule.warmup_steps=0 \
    --set train.async_checkpoint=$mode >/dev/null
done
sync_blocked=$(field "$OUT/false/metrics.jsonl" blocked_s | median)
async_blocked=$(field "$OUT/true/metrics.jsonl" blocked_s | median)
async_write=$(field "$OUT/true/metrics.jsonl" write_s | median)
bytes=$(stat -c %s "$(ls "$OUT/true/checkpoints/"*.h5 | tail -1)")
echo "$CONFIG: checkpoint of $((bytes / 1048576)) MiB every $EVERY steps, $STEPS steps; median over $((STEPS / EVERY)) checkpoints"
echo
echo "| mode | step loop blocked (s) | write (s) |"
echo "|---|---:|---:|"
echo "| synchronous | $sync_blocked | $sync_blocked |"
echo "| asynchronous | $async_blocked | $async_write |"
awk -v a="$async_blocked" -v s="$sync_blocked" 'BEGIN {printf "\nasync blocks the loop for %.1f%% of a synchronous save\n", 100 * a / s}'

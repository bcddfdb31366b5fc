#!/usr/bin/env bash
# `flowrun time` reports a step time, a per-layer and per-op breakdown, and a JSON line with the numbers.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
expect_exit 0 "$FLOWRUN" time "$SRC/tests/configs/tiny_mlp.yaml" --steps 4 --warmup 1 --profile 2 --json
expect_log "step: median"
expect_log "hidden.0"
expect_log "matmul"
json=$(tail -1 "$SCRATCH/last.log")
for key in median_step_ms p10_step_ms peak_rss_mib arena_mib params flops_per_step threads samples_per_step; do
  grep -q "\"$key\": [0-9]" <<<"$json" || fail "JSON line lacks $key: $json"
done
expect_exit 2 "$FLOWRUN" time "$SRC/tests/configs/tiny_mlp.yaml" --set train.stepz=3
expect_log "did you mean 'steps'"
echo "time ok"

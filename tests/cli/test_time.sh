#!/usr/bin/env bash
# `flowrun time` reports a step time, a per-layer and per-op breakdown, and a JSON line with the numbers.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
expect_exit 0 "$FLOWRUN" time "$SRC/tests/configs/tiny_mlp.yaml" --steps 4 --warmup 1 --profile 2 --json
expect_log "step: median"
expect_log "hidden.0"
expect_log "matmul"
json=$(tail -1 "$SCRATCH/last.log")
for key in median_step_ms p10_step_ms peak_rss_mib page_faults_per_step arena_mib params flops_per_step threads \
  samples_per_step; do
  grep -q "\"$key\": [0-9]" <<<"$json" || fail "JSON line lacks $key: $json"
done
# --nodes N: the N slowest nodes, each with its op and the types it read and wrote.
expect_exit 0 "$FLOWRUN" time "$SRC/tests/configs/tiny_mlp.yaml" --steps 2 --warmup 1 --profile 2 --nodes 3
rows=$(sed -n '/^node  /,/^$/p' "$SCRATCH/last.log" | tail -n +2 | grep -c ' -> ')
[ "$rows" = 3 ] || fail "--nodes 3 listed $rows nodes"
expect_exit 0 "$FLOWRUN" time "$SRC/tests/configs/tiny_mlp.yaml" --steps 1 --warmup 0 --profile 1 --nodes 1000
grep -Eq '^hidden.0/fc/linear +linear +[0-9.]+ +[0-9.]+  f32\[64,784\], f32\[64,784\], f32\[64\] -> f32\[64,64\]$' \
  "$SCRATCH/last.log" || fail "no row for hidden.0/fc/linear with its types"
# A steady-state step faults no fresh pages in. gpt-tiny's bf16 weight gradients (oneDNN's gemm kernel on AMX
# hosts, which mallocs a 404 KiB packing buffer per call) faulted in ~3,200 pages a step for one layer while
# malloc mapped such blocks afresh each time (apps/flowrun.cc's thresholds).
expect_exit 0 "$FLOWRUN" time "$SRC/configs/bench/gpt_tiny.yaml" --set model.n_layer=1 --set precision.dtype=bf16 \
  --steps 3 --warmup 5 --profile 0 --json
expect_log "page faults a step"
faults=$(tail -1 "$SCRATCH/last.log" | grep -oE '"page_faults_per_step": [0-9.e+-]+' | awk '{print $2}')
[ -n "$faults" ] || fail "no page_faults_per_step in the JSON line"
awk -v f="$faults" 'BEGIN { exit !(f < 500) }' || fail "a steady-state bf16 step faulted $faults pages in"
expect_exit 2 "$FLOWRUN" time "$SRC/tests/configs/tiny_mlp.yaml" --set train.stepz=3
expect_log "did you mean 'steps'"
echo "time ok"

#!/usr/bin/env bash
# Every verb answers --help with exit code 0; bad command lines exit 2.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1
for verb in "" train eval check time plan calibrate inspect data models version ops generate; do
  expect_exit 0 "$FLOWRUN" $verb --help
  expect_log "Usage"
done
expect_exit 2 "$FLOWRUN"
expect_exit 2 "$FLOWRUN" frobnicate
# Issue 16 row 10: a mistyped or missing verb is named, with the closest one.
expect_exit 2 "$FLOWRUN" trian x.yaml
expect_log "unknown command 'trian' (did you mean 'train'?)"
expect_exit 2 "$FLOWRUN" generate x.yaml
expect_log "--checkpoint is required"
expect_exit 2 "$FLOWRUN" train
expect_exit 2 "$FLOWRUN" train x.yaml --exit-at-step -3
expect_exit 2 "$FLOWRUN" data mnist
expect_exit 2 "$FLOWRUN" train "$SCRATCH/missing.yaml"
expect_log "missing.yaml"
expect_exit 2 "$FLOWRUN" plan
expect_exit 2 "$FLOWRUN" plan "$SCRATCH/missing.yaml" --world-size 0
expect_exit 2 "$FLOWRUN" inspect "$SCRATCH/a.h5" --diff "$SCRATCH/missing.h5"
# The scripts users call answer --help too.
for script in sweep bench_precision.sh bench_checkpoint.sh bench_vs_torch.sh bench_generate.sh bench_search.sh; do
  expect_exit 0 "$(dirname "$0")/../../scripts/$script" --help
done
echo "help and usage errors ok"

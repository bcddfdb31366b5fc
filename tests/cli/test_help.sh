#!/usr/bin/env bash
# Every verb answers --help with exit code 0; bad command lines exit 2.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1
for verb in "" train eval check time inspect data models version ops; do
  expect_exit 0 "$FLOWRUN" $verb --help
  expect_log "Usage"
done
expect_exit 2 "$FLOWRUN"
expect_exit 2 "$FLOWRUN" frobnicate
expect_exit 2 "$FLOWRUN" train
expect_exit 2 "$FLOWRUN" train x.yaml --exit-at-step -3
expect_exit 2 "$FLOWRUN" data mnist
expect_exit 2 "$FLOWRUN" train "$SCRATCH/missing.yaml"
expect_log "missing.yaml"
echo "help and usage errors ok"

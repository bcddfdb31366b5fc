#!/usr/bin/env bash
# `flowrun eval` on the final checkpoint reproduces the validation metrics logged at the end of training.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
CFG="$SRC/tests/configs/tiny_mlp.yaml"
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/run" --no-progress
last=$(grep '"val_accuracy"' "$SCRATCH/run/metrics.jsonl" | tail -1)
acc=$(sed -E 's/.*"val_accuracy": ([^,}]*).*/\1/' <<<"$last")
loss=$(sed -E 's/.*"val_loss": ([^,}]*).*/\1/' <<<"$last")
expect_exit 0 "$FLOWRUN" eval "$CFG" --checkpoint "$SCRATCH/run/checkpoints/step_00000060.h5"
expect_log "val_loss $(printf '%.5g' "$loss"), val_accuracy $(printf '%.5g' "$acc")"
echo "eval reproduces val_loss $loss, val_accuracy $acc"

#!/usr/bin/env bash
# Bit-exact resume: 2N steps straight versus N steps, --exit-at-step, then --resume auto. Every logged
# step's loss (and the evals) and the final parameters and optimizer state must be bitwise equal.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
CFG="$SRC/tests/configs/tiny_gpt.yaml"

expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/straight" --no-progress
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/sliced" --no-progress --exit-at-step 10
expect_log "stopped at step 10"
[[ -f "$SCRATCH/sliced/checkpoints/step_00000020.h5" ]] && fail "the sliced run went past step 10"
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/sliced" --no-progress --resume auto
expect_log "resumed from $SCRATCH/sliced/checkpoints/step_00000010.h5"

diff <(losses "$SCRATCH/straight/metrics.jsonl") <(losses "$SCRATCH/sliced/metrics.jsonl") ||
  fail "per-step losses differ between the straight and the resumed run"
[[ $(grep -c '"loss"' "$SCRATCH/straight/metrics.jsonl") -eq 20 ]] || fail "expected 20 logged steps"
A="$SCRATCH/straight/checkpoints/step_00000020.h5" B="$SCRATCH/sliced/checkpoints/step_00000020.h5"
h5diff "$A" "$B" /params /params || fail "final parameters differ"
h5diff "$A" "$B" /state /state || fail "final optimizer state differs"
echo "resume is bit-exact"

#!/usr/bin/env bash
# Bit-exact resume: 2N steps straight versus N steps, --exit-at-step, then --resume auto. Every logged
# step's loss (and the evals, and under fp16 the loss scale and skipped-step count) and the final parameters
# and optimizer state (the loss scaler's included) must be bitwise equal. Run in fp32, bf16 and fp16; the fp16
# run starts from a scale that overflows and grows every 3 good steps, so the scaler changes on both sides
# of the checkpoint.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
CFG="$SRC/tests/configs/tiny_gpt.yaml"

check_resume() {
  local name=$1; shift
  local dir="$SCRATCH/$name"
  expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$dir/straight" --no-progress "$@"
  expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$dir/sliced" --no-progress --exit-at-step 10 "$@"
  expect_log "stopped at step 10"
  [[ -f "$dir/sliced/checkpoints/step_00000020.h5" ]] && fail "$name: the sliced run went past step 10"
  expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$dir/sliced" --no-progress --resume auto "$@"
  expect_log "resumed from $dir/sliced/checkpoints/step_00000010.h5"

  diff <(losses "$dir/straight/metrics.jsonl") <(losses "$dir/sliced/metrics.jsonl") ||
    fail "$name: per-step records differ between the straight and the resumed run"
  [[ $(grep -c '"loss"' "$dir/straight/metrics.jsonl") -eq 20 ]] || fail "$name: expected 20 logged steps"
  local a="$dir/straight/checkpoints/step_00000020.h5" b="$dir/sliced/checkpoints/step_00000020.h5"
  h5diff "$a" "$b" /params /params || fail "$name: final parameters differ"
  h5diff "$a" "$b" /state /state || fail "$name: final optimizer state differs"
  echo "$name: resume is bit-exact"
}

check_resume fp32
check_resume bf16 --set precision.dtype=bf16
check_resume fp16 --set precision.dtype=fp16 --set precision.initial_scale=1e6 --set precision.growth_interval=3
# The fp16 case must really have exercised the scaler across the checkpoint: skips, then growth.
M="$SCRATCH/fp16/straight/metrics.jsonl"
skipped=$(grep -o '"skipped_steps": [0-9]*' "$M" | tail -1 | awk '{print $2}')
[[ $skipped -gt 0 ]] || fail "fp16: no step was skipped"
scales=$(grep -o '"loss_scale": [0-9.e+]*' "$M" | awk '{print $2}' | uniq | wc -l)
[[ $scales -ge 3 ]] || fail "fp16: the loss scale changed only $((scales - 1)) times"
h5dump -d /state/amp/skipped_steps "$SCRATCH/fp16/sliced/checkpoints/step_00000020.h5" >/dev/null ||
  fail "fp16: the checkpoint lacks the scaler state"

#!/usr/bin/env bash
# Every shipped config runs as it is from a new checkout (issue 16 row 11): each is checked, and trains one
# step (--exit-at-step 1: its schedule is untouched) with its data converted on first use. GPT-2 124M, the
# GPU benchmark, is compiled (check --plan) rather than stepped: one CPU step of it takes minutes; Llama-2-7B's
# shape, which no CPU here holds, is planned.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
n=0
for cfg in "$SRC"/configs/*.yaml "$SRC"/configs/bench/*.yaml; do
  name=$(basename "$cfg" .yaml)
  expect_exit 0 "$FLOWRUN" check "$cfg"
  expect_log "parameters"
  if [[ "$name" == gpt2_124m ]]; then
    expect_exit 0 "$FLOWRUN" check "$cfg" --plan
    expect_log "# training step in bf16"
  elif [[ "$name" == llama2_7b ]]; then
    expect_exit 0 "$FLOWRUN" plan "$cfg"
    expect_log "model: 6,738,415,616 parameters"
  else
    expect_exit 0 "$FLOWRUN" train "$cfg" --run-dir "$SCRATCH/$name" --exit-at-step 1 --no-progress
    expect_log "stopped at step 1"
  fi
  n=$((n + 1))
done
[[ $n -ge 8 ]] || fail "only $n configs found"
echo "all $n shipped configs run"

#!/usr/bin/env bash
# The modern zoo (Llama, ViT, BERT; tests/configs/tiny_*.yaml, dropout on) in every layout and precision:
# DP2, TP2 and PP2 (4 micro-batches) log the per-step losses of one process within 1e-5 relative and end with
# the same weights (SGD with momentum, so that every tensor is held to 1e-5); bf16 and fp16 track fp32 (the
# mean loss of the last 50 of 200 steps of batch 32 within 2%); and a run stopped at step 10 and resumed is bitwise the
# uninterrupted one.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
COMMON=(--no-progress --set train.log_every=1 --set train.eval_every=0)
SGD=(--set optimizer.type=sgd --set optimizer.momentum=0.9 --set optimizer.lr=0.1)
ACC4=(--set train.grad_accumulation=4)

for model in llama vit bert; do
  cfg="$SRC/tests/configs/tiny_$model.yaml"
  # BERT's separate key projection has a bias whose exact gradient is zero (see check_case).
  NOISE=$([[ $model == bert ]] && echo 'attn/k/b' || true)
  check_case "$model" "$cfg" "" 2:2:1 "${SGD[@]}"
  check_case "$model" "$cfg" "" 2:1:2 "${SGD[@]}"
  check_case "$model-pp" "$cfg" "" 2:1:1:2 "${SGD[@]}" "${ACC4[@]}"
  # Four micro-batches of 2 make the step one batch of 8 makes: the loss is the mean over the whole step
  # (BERT's: over all of its masked positions, whichever micro-batch holds them).
  rel=$(max_rel "$SCRATCH/$model-1/metrics.jsonl" "$SCRATCH/$model-pp-1/metrics.jsonl")
  within "$rel" 1e-5 || fail "$model: 4 micro-batches of 2 differ from one batch of 8 by $rel"
  echo "$model: 4 accumulated micro-batches within $rel of one batch"

  for dtype in fp32 bf16 fp16; do
    expect_exit 0 "$FLOWRUN" train "$cfg" --run-dir "$SCRATCH/$model-$dtype" "${COMMON[@]}" \
      --set train.steps=200 --set train.batch_size=32 --set train.checkpoint_every=0 --set precision.dtype=$dtype
  done
  tracks_fp32 "$model" "$SCRATCH/$model"

  dir="$SCRATCH/$model-resume"
  expect_exit 0 "$FLOWRUN" train "$cfg" --run-dir "$dir/straight" --no-progress
  expect_exit 0 "$FLOWRUN" train "$cfg" --run-dir "$dir/sliced" --no-progress --exit-at-step 10
  expect_exit 0 "$FLOWRUN" train "$cfg" --run-dir "$dir/sliced" --no-progress --resume auto
  expect_log "resumed from $dir/sliced/checkpoints/step_00000010.h5"
  diff <(losses "$dir/straight/metrics.jsonl") <(losses "$dir/sliced/metrics.jsonl") ||
    fail "$model: per-step records differ between the straight and the resumed run"
  a="$dir/straight/checkpoints/step_00000020.h5" b="$dir/sliced/checkpoints/step_00000020.h5"
  h5diff "$a" "$b" /params /params || fail "$model: final parameters differ after resume"
  h5diff "$a" "$b" /state /state || fail "$model: final optimizer state differs after resume"
  echo "$model: resume is bit-exact"

  if [[ $model == bert ]]; then
    # The validation scores the masked positions (the eval program's targets), about 15% of the 512 bytes
    # of tiny_bert's 2 evaluation batches, not every byte against the next one.
    expect_exit 0 "$FLOWRUN" eval "$cfg" --checkpoint "$a"
    n=$(grep -o 'over [0-9]* tokens' "$SCRATCH/last.log" | awk '{print $2}')
    ((n > 25 && n < 128)) || fail "bert: eval scored $n of 512 tokens, expected about 77 (15%)"
    echo "bert: eval scores the $n masked tokens"
  fi
done

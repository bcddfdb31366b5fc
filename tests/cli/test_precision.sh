#!/usr/bin/env bash
# Mixed precision tracks fp32: the MLP (Fashion-MNIST, SGD Nesterov), the GPT (KJV, AdamW, clipping) and a
# ResNet (batchnorm on bf16 activations with f32 statistics) train 200 steps in fp32, bf16 and fp16 from the
# same seed and data order; the mean loss of the last 50 steps in bf16 and fp16 must be within 2% of fp32's. Then a forced overflow: fp16 from a loss scale of
# 1e30 must skip steps, halve the scale on each, recover (the loss falls) and grow the scale again.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
COMMON=(--no-progress --set train.steps=200 --set train.log_every=1 --set train.eval_every=0
        --set train.checkpoint_every=0)

for model in mlp gpt resnet; do
  for dtype in fp32 bf16 fp16; do
    expect_exit 0 "$FLOWRUN" train "$SRC/tests/configs/tiny_$model.yaml" --run-dir "$SCRATCH/$model-$dtype" \
      "${COMMON[@]}" --set precision.dtype=$dtype
  done
  tracks_fp32 "$model" "$SCRATCH/$model"
done

# Forced overflow. Every logged step (log_every 1) shows the scale and the skipped-step count.
M="$SCRATCH/overflow/metrics.jsonl"
expect_exit 0 "$FLOWRUN" train "$SRC/tests/configs/tiny_mlp.yaml" --run-dir "$SCRATCH/overflow" "${COMMON[@]}" \
  --set precision.dtype=fp16 --set precision.initial_scale=1e30 --set precision.growth_interval=20
awk '
  match($0, /"loss": [0-9.e+-]*/) {
    loss = substr($0, RSTART + 8, RLENGTH - 8) + 0
    match($0, /"loss_scale": [0-9.e+-]*/); scale = substr($0, RSTART + 14, RLENGTH - 14) + 0
    match($0, /"skipped_steps": [0-9]*/); skipped = substr($0, RSTART + 17, RLENGTH - 17) + 0
    if (NR == 1) { first = loss; if (skipped != 1 || scale / 5e29 - 1 > 1e-6 || 1 - scale / 5e29 > 1e-6) { print "step 1: scale " scale ", skipped " skipped; bad = 1 } }
    else if (skipped == prev_skipped + 1) { halvings++; if (scale != prev_scale / 2) { print "a skip did not halve the scale at line " NR; bad = 1 } }
    else if (skipped == prev_skipped && scale > prev_scale) { if (scale != prev_scale * 2) { print "growth not x2 at line " NR; bad = 1 }; growths++ }
    else if (skipped != prev_skipped || scale != prev_scale) { print "unexpected scaler change at line " NR; bad = 1 }
    prev_scale = scale; prev_skipped = skipped; last = loss; n++
  }
  END {
    printf "overflow: %d skipped steps, %d growths, loss %.4f -> %.4f over %d steps\n", prev_skipped, growths, first, last, n
    if (bad || prev_skipped < 10 || growths < 1 || n != 200 || last > 0.8 * first) exit 1
  }' "$M" || fail "the forced overflow did not skip, halve, recover and grow as expected"

# Switching precision on resume: an fp32 checkpoint continues in fp16 (the scaler starts afresh), and an
# fp16 one in fp32 (its scaler state is left unused).
expect_exit 0 "$FLOWRUN" train "$SRC/tests/configs/tiny_gpt.yaml" --run-dir "$SCRATCH/switch" --no-progress \
  --exit-at-step 5
expect_exit 0 "$FLOWRUN" train "$SRC/tests/configs/tiny_gpt.yaml" --run-dir "$SCRATCH/switch" --no-progress \
  --resume auto --exit-at-step 10 --set precision.dtype=fp16
expect_log "the loss scaler starts afresh"
expect_log "stopped at step 10"
expect_exit 0 "$FLOWRUN" train "$SRC/tests/configs/tiny_gpt.yaml" --run-dir "$SCRATCH/switch" --no-progress \
  --resume auto
expect_log "done: 20 steps"

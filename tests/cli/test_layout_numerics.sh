#!/usr/bin/env bash
# Numbers that must not depend on the layout, against one process (tiny GPT, dropout 0.1): the validation
# loss of the same weights under DP2 and PP2 (data.eval_batches counts the same samples in any layout, and
# `flowrun eval` of the checkpoint agrees), and the losses of PP2 (4 micro-batches) and of a DP2 checkpoint
# resumed under PP2, whose dropout masks are the unsplit batch's.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
CFG="$SRC/tests/configs/tiny_gpt.yaml"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)
COMMON=(--no-progress --set train.log_every=1 --set train.eval_every=0)
PP2=(--set parallel.pipeline=2 --set parallel.micro_batches=4)

val_loss() { grep -o '"val_loss": [0-9.e+-]*' "$1" | tail -1 | awk '{print $2}'; }
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = (a - b) / a; if (d < 0) d = -d; printf "%.3g\n", d }'; }

# The same weights in every layout: a learning rate far too small to move them (1e-9 against weights of
# ~1e-2), then the final evaluation over data.eval_batches (2) batches.
FROZEN=(--set train.steps=2 --set optimizer.lr=1e-9 --set schedule.warmup_steps=0)
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/eval-1" "${COMMON[@]}" "${FROZEN[@]}"
expect_exit 0 "${MPIRUN[@]}" "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/eval-dp2" "${COMMON[@]}" "${FROZEN[@]}" \
  --set parallel.data=2
expect_exit 0 "${MPIRUN[@]}" "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/eval-pp2" "${COMMON[@]}" "${FROZEN[@]}" \
  "${PP2[@]}"
one=$(val_loss "$SCRATCH/eval-1/metrics.jsonl")
[[ -n "$one" ]] || fail "the one-process run logged no val_loss"
for layout in dp2 pp2; do
  v=$(val_loss "$SCRATCH/eval-$layout/metrics.jsonl")
  [[ -n "$v" ]] || fail "$layout logged no val_loss"
  r=$(rel "$one" "$v")
  within "$r" 1e-6 || fail "$layout: val_loss $v, one process $one (relative $r)"
  ckpt=$(ls "$SCRATCH/eval-$layout/checkpoints/"*.h5 | tail -1)
  expect_exit 0 "$FLOWRUN" eval "$CFG" --checkpoint "$ckpt"
  printed=$(grep -o 'val_loss [0-9.e+-]*' "$SCRATCH/last.log" | awk '{print $2}')
  [[ "$printed" == "$(printf '%.5g' "$v")" ]] ||
    fail "$layout: flowrun eval of $ckpt prints val_loss $printed, training logged $v"
  echo "$layout: val_loss $v within $r of one process's $one; flowrun eval of its checkpoint: $printed"
done

# Dropout under pipeline micro-batches: PP2 (4 micro-batches of 2) follows the unsplit batch of 8.
STEPS=(--set train.steps=6)
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/drop-1" "${COMMON[@]}" "${STEPS[@]}"
expect_exit 0 "${MPIRUN[@]}" "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/drop-pp2" "${COMMON[@]}" "${STEPS[@]}" \
  "${PP2[@]}"
r=$(max_rel "$SCRATCH/drop-1/metrics.jsonl" "$SCRATCH/drop-pp2/metrics.jsonl")
within "$r" 1e-5 || fail "PP2 with dropout: losses differ from the unsplit one-process run by $r"
echo "PP2 (4 micro-batches) with dropout: losses within $r of the unsplit batch"

# A DP2 checkpoint resumed under PP2 continues as the unsplit run.
run="$SCRATCH/dp2-to-pp2"
expect_exit 0 "${MPIRUN[@]}" "$FLOWRUN" train "$CFG" --run-dir "$run" "${COMMON[@]}" "${STEPS[@]}" \
  --set parallel.data=2 --exit-at-step 3
expect_exit 0 "${MPIRUN[@]}" "$FLOWRUN" train "$CFG" --run-dir "$run" "${COMMON[@]}" "${STEPS[@]}" "${PP2[@]}" \
  --resume auto
r=$(max_rel "$SCRATCH/drop-1/metrics.jsonl" "$run/metrics.jsonl")
within "$r" 1e-5 || fail "DP2 -> PP2 resume with dropout: losses differ from the unsplit run by $r"
echo "DP2 checkpoint resumed under PP2 with dropout: losses within $r of the unsplit run"

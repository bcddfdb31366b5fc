#!/usr/bin/env bash
# A diverging run (the GPT at optimizer.lr=1e6) stops with exit 1 and never checkpoints inf or NaN: the
# message names the last good checkpoint, or says the run has none; `flowrun eval` of a checkpoint whose
# loss is not finite (here: its huge weights overflow fp16) exits 1 instead of printing "val_loss nan".
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
GPT="$SRC/tests/configs/tiny_gpt.yaml"
HOT=(--no-progress --set optimizer.lr=1e6 --set train.eval_every=0)

RUN="$SCRATCH/every"
expect_exit 1 "$FLOWRUN" train "$GPT" --run-dir "$RUN" "${HOT[@]}" --set train.checkpoint_every=1 \
  --set train.keep_checkpoints=100
grep -q "intact" "$SCRATCH/last.log" && { cat "$SCRATCH/last.log" >&2; fail "the message claims an intact checkpoint"; }
newest=$(ls "$RUN"/checkpoints/step_*.h5 2>/dev/null | sort | tail -1)
[[ -n "$newest" ]] || fail "no checkpoint before the divergence"
expect_log "; the last good checkpoint is $newest"
for ck in "$RUN"/checkpoints/step_*.h5; do
  h5dump "$ck" | grep -qEiw -- "-?(inf|nan)" && fail "$ck holds inf or NaN"
done
expect_exit 1 "$FLOWRUN" eval "$GPT" --checkpoint "$newest" --set precision.dtype=fp16
expect_log "eval $newest: the validation loss is"
expect_log "not finite"

# No checkpoint before the loss goes bad: the message says there is none.
expect_exit 1 "$FLOWRUN" train "$GPT" --run-dir "$SCRATCH/none" "${HOT[@]}" --set train.checkpoint_every=0
expect_log "this run has no good checkpoint"
compgen -G "$SCRATCH/none/checkpoints/step_*" >/dev/null && fail "a diverged run wrote a checkpoint"
echo "diverged runs ok"

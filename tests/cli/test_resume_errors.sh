#!/usr/bin/env bash
# Resume and checkpoint misuse: a missing --resume path is an error (never a silent fresh start),
# --resume with --init-from is refused, a damaged checkpoint is reported by name, and --init-from loads
# weights into a fresh run.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
CFG="$SRC/tests/configs/tiny_mlp.yaml"
RUN="$SCRATCH/run"

expect_exit 2 "$FLOWRUN" train "$CFG" --run-dir "$RUN" --resume "$SCRATCH/nope.h5"
expect_log "nope.h5 does not exist"
[[ -e "$RUN/metrics.jsonl" ]] && fail "a failed resume started training"
expect_exit 2 "$FLOWRUN" train "$CFG" --run-dir "$RUN" --resume auto --init-from "$SCRATCH/x.h5"
expect_exit 2 "$FLOWRUN" eval "$CFG" --checkpoint "$SCRATCH/nope.h5"

# --resume auto with no checkpoint starts fresh; then a finished run resumes as a no-op.
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$RUN" --no-progress --resume auto
expect_log "starting fresh"
CK="$RUN/checkpoints/step_00000060.h5"
[[ -f "$CK" ]] || fail "no final checkpoint"
expect_exit 0 "$FLOWRUN" inspect "$CK"
expect_log "integrity: OK"

# Flip one byte inside the largest dataset: inspect, eval and resume must refuse it, naming the file.
BAD="$SCRATCH/bad.h5"
cp "$CK" "$BAD"
largest=$(h5ls -r "$BAD" | awk '/Dataset/ {gsub(/[{}]/, "", $3); split($3, d, ", "); n = 1;
          for (i in d) n *= d[i]; if (n > best) { best = n; name = $1 } } END { print name }')
offset=$(h5dump -p -H -d "$largest" "$BAD" | awk '/OFFSET/ { print $2; exit }')
[[ -n "$offset" ]] || fail "could not locate the data of $largest"
printf '\x5a' | dd of="$BAD" bs=1 seek=$((offset + 100)) conv=notrunc status=none
expect_exit 2 "$FLOWRUN" inspect "$BAD"
expect_log "bad.h5"
expect_log "checksum"
expect_exit 2 "$FLOWRUN" eval "$CFG" --checkpoint "$BAD"
expect_log "bad.h5"
expect_exit 2 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/run2" --resume "$BAD"
expect_log "bad.h5"

# A truncated file is reported too.
head -c 3000 "$CK" >"$SCRATCH/short.h5"
expect_exit 2 "$FLOWRUN" inspect "$SCRATCH/short.h5"
expect_log "short.h5"

# Fine-tuning: --init-from takes the weights, not the step.
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/ft" --no-progress --init-from "$CK" --set train.steps=5
expect_log "initialised parameters from $CK"
expect_log "done: 5 steps"

# Same shapes, another architecture (n_head 2 -> 4 splits d_model 32 either way): a resume is refused,
# naming the key and both values; --init-from, which takes only the weights, may change it.
GPT="$SRC/tests/configs/tiny_gpt.yaml"
expect_exit 0 "$FLOWRUN" train "$GPT" --run-dir "$SCRATCH/gpt" --no-progress --exit-at-step 5
expect_exit 2 "$FLOWRUN" train "$GPT" --run-dir "$SCRATCH/gpt" --no-progress --resume auto --set model.n_head=4
expect_log "step_00000005.h5 was saved with another architecture"
expect_log "model.params.n_head: checkpoint 2, this run 4"
expect_log "--init-from"
expect_exit 2 "$FLOWRUN" train "$GPT" --run-dir "$SCRATCH/gpt" --no-progress --resume auto \
  --set model.n_head=4 --set model.dropout=0.2
expect_log "model.params.dropout: checkpoint 0.1, this run 0.2"
expect_exit 0 "$FLOWRUN" train "$GPT" --run-dir "$SCRATCH/gpt4" --no-progress --set model.n_head=4 \
  --init-from "$SCRATCH/gpt/checkpoints/step_00000005.h5" --set train.steps=5
expect_log "done: 5 steps"
expect_exit 0 "$FLOWRUN" train "$GPT" --run-dir "$SCRATCH/gpt" --no-progress --resume auto
expect_log "resumed from $SCRATCH/gpt/checkpoints/step_00000005.h5"
echo "resume and checkpoint errors ok"

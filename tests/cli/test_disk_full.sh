#!/usr/bin/env bash
# Failed writes (RLIMIT_FSIZE: `ulimit -f`, with SIGXFSZ ignored, makes write(2) fail with EFBIG as a full
# disk would) stop the run with exit 1 naming the file and the errno text, and never cost data: the
# rewrite of metrics.jsonl on --resume leaves the old file as it was, a failed metrics line or checkpoint
# leaves no partial checkpoint behind.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
CFG="$SRC/tests/configs/tiny_mlp.yaml"
ARGS=(--no-progress --set train.log_every=1)

# limited KiB CMD...: CMD with files limited to KiB 1024-byte blocks.
limited() {
  local kib=$1; shift
  (trap '' XFSZ; ulimit -f "$kib"; exec "$@")
}

# --resume auto rewrites metrics.jsonl (dropping lines after the checkpoint): 30 steps of lines, > 1 KiB.
RUN="$SCRATCH/resume"
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$RUN" "${ARGS[@]}" --exit-at-step 30
cp "$RUN/metrics.jsonl" "$SCRATCH/metrics.before"
(($(stat -c %s "$SCRATCH/metrics.before") > 1024)) || fail "metrics.jsonl is too small for the test"
expect_exit 1 limited 1 "$FLOWRUN" train "$CFG" --run-dir "$RUN" "${ARGS[@]}" --resume auto
expect_log "$RUN/metrics.jsonl"
expect_log "File too large"
cmp -s "$RUN/metrics.jsonl" "$SCRATCH/metrics.before" || fail "the failed rewrite changed metrics.jsonl"
compgen -G "$RUN/metrics.jsonl.tmp*" >/dev/null && fail "a temporary metrics file was left behind"
# With room again the resume goes on from the same file.
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$RUN" "${ARGS[@]}" --resume auto
expect_log "resumed from $RUN/checkpoints/step_00000030.h5"
[[ $(grep -c '"loss"' "$RUN/metrics.jsonl") -eq 60 ]] || fail "metrics.jsonl lacks lines after the resume"

# Appending: metrics.jsonl outgrows 3 KiB (config.yaml fits) long before the only checkpoint (the last step).
RUN="$SCRATCH/append"
expect_exit 1 limited 3 "$FLOWRUN" train "$CFG" --run-dir "$RUN" "${ARGS[@]}" --set train.checkpoint_every=0 \
  --set train.eval_every=0
expect_log "cannot write metrics file $RUN/metrics.jsonl: File too large"

# A checkpoint (parameters and momentum: ~400 KiB) that does not fit: no file of it is left.
RUN="$SCRATCH/ckpt"
expect_exit 1 limited 100 "$FLOWRUN" train "$CFG" --run-dir "$RUN" --no-progress --set train.log_every=100
expect_log "step_00000030.h5"
compgen -G "$RUN/checkpoints/step_*" >/dev/null && fail "a partial checkpoint was left behind"
echo "failed writes ok"

#!/usr/bin/env bash
# SIGKILL while a checkpoint is being written: the half-written file is never taken for a checkpoint, and
# --resume auto continues from the previous complete one and finishes.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
CFG="$SRC/tests/configs/tiny_mlp.yaml"
# Wide layers make each checkpoint (parameters + momentum) ~50 MB, so writing it takes a while.
SETS=(--set 'model.hidden=[2048,2048]' --set train.steps=40 --set train.checkpoint_every=3
      --set train.eval_every=0 --set train.keep_checkpoints=2)
RUN="$SCRATCH/run"
CK="$RUN/checkpoints"
caught=0
for attempt in 1 2 3 4 5; do
  rm -rf "$RUN"
  "$FLOWRUN" train "$CFG" "${SETS[@]}" --run-dir "$RUN" --no-progress >"$SCRATCH/train.log" 2>&1 &
  pid=$!
  # Wait for a second checkpoint to be in flight (so that a complete one exists), then kill.
  while kill -0 "$pid" 2>/dev/null; do
    if compgen -G "$CK/step_*.h5" >/dev/null && compgen -G "$CK/*.tmp*" >/dev/null; then
      kill -9 "$pid"
      break
    fi
    sleep 0.005
  done
  wait "$pid" 2>/dev/null || true
  if compgen -G "$CK/*.tmp*" >/dev/null; then caught=1; break; fi
done
[[ $caught -eq 1 ]] || fail "never caught the trainer while it wrote a checkpoint"
newest=$(ls "$CK"/step_*.h5 | sort | tail -1)
expect_exit 0 "$FLOWRUN" train "$CFG" "${SETS[@]}" --run-dir "$RUN" --no-progress --resume auto
expect_log "resumed from $newest"
expect_log "done: 40 steps"
compgen -G "$CK/*.tmp*" >/dev/null && fail "a stale temporary checkpoint was left behind"
echo "killed mid-write; resumed from $newest"

# 20 SIGKILLs at random moments of a run that checkpoints every step (asynchronously, the default): every
# checkpoint file that is visible afterwards is complete and verifies.
RUN2="$SCRATCH/random"
for trial in $(seq 20); do
  rm -rf "$RUN2"
  "$FLOWRUN" train "$SRC/tests/configs/tiny_gpt.yaml" --run-dir "$RUN2" --no-progress --set train.steps=100000 \
    --set train.checkpoint_every=1 --set train.keep_checkpoints=3 >/dev/null 2>&1 &
  pid=$!
  sleep "0.$((RANDOM % 9 + 1))$((RANDOM % 10))"
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  for f in "$RUN2"/checkpoints/step_*.h5; do
    [[ -e "$f" ]] || continue
    "$FLOWRUN" inspect "$f" >/dev/null 2>&1 || fail "trial $trial: visible checkpoint $f does not verify"
  done
done
echo "20 random SIGKILLs: every visible checkpoint verified"

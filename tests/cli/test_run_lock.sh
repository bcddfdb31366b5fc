#!/usr/bin/env bash
# One run per run directory: a second `flowrun train` on a directory in use is refused at once (exit 2),
# naming the directory and the running one's pid, and touches nothing there; under mpirun every rank of
# the refused job stops (none hangs). The lock dies with its holder: after a SIGKILL the directory resumes.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
CFG="$SRC/tests/configs/tiny_mlp.yaml"
RUN="$SCRATCH/run"
LONG=(--no-progress --set train.steps=1000000 --set train.log_every=1 --set train.eval_every=0
      --set train.checkpoint_every=20)

"$FLOWRUN" train "$CFG" --run-dir "$RUN" "${LONG[@]}" --set train.seed=1 >"$SCRATCH/first.log" 2>&1 &
first=$!
trap 'kill -9 $first 2>/dev/null || true; rm -rf "$SCRATCH"' EXIT
wait_logged "$RUN/metrics.jsonl" 1

start=$SECONDS
expect_exit 2 timeout 120 "$FLOWRUN" train "$CFG" --run-dir "$RUN" --no-progress --set train.seed=2
expect_log "the run directory $RUN is in use by another flowrun train (pid $first"
((SECONDS - start < 60)) || fail "the second run was refused only after $((SECONDS - start)) s"
kill -0 "$first" 2>/dev/null || { cat "$SCRATCH/first.log" >&2; fail "the first run stopped"; }
grep -q 'seed: 1$' "$RUN/config.yaml" || fail "the refused run rewrote config.yaml"

if command -v mpirun >/dev/null; then
  expect_exit 2 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$FLOWRUN" train "$CFG" \
    --run-dir "$RUN" --no-progress --set parallel.data=2 --set train.seed=2
  expect_log "is in use by another flowrun train (pid $first"
  kill -0 "$first" 2>/dev/null || fail "the first run stopped during the refused mpirun job"
fi

# SIGKILL leaves the lock file behind but not the lock: --resume auto continues the directory.
for _ in $(seq 600); do
  compgen -G "$RUN/checkpoints/step_*.h5" >/dev/null && break
  sleep 0.05
done
kill -9 "$first"
wait "$first" 2>/dev/null || true
[[ -f "$RUN/flowrun.lock" ]] || fail "no lock file in the run directory"
newest=$(ls "$RUN"/checkpoints/step_*.h5 | sort | tail -1)
step=$(basename "$newest" .h5)
step=$((10#${step#step_}))
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$RUN" "${LONG[@]}" --set train.seed=1 --resume auto \
  --exit-at-step $((step + 1))
expect_log "resumed from $newest"
expect_log "stopped at step $((step + 1))"
echo "run directory lock ok"

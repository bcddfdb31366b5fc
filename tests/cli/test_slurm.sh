#!/usr/bin/env bash
# Against a real one-node Slurm started for the test (scripts/slurm/local_cluster.sh): a 4-point sweep runs
# as a job array; a job sent SIGUSR1 checkpoints, requeues itself, resumes and ends with per-step losses
# identical to an uninterrupted run; a 2-rank run under `srun --mpi=pmix` trains and resumes.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
export FLOWRUN
CLUSTER="$SCRATCH/cluster"
trap '"$SRC/scripts/slurm/local_cluster.sh" stop "$CLUSTER"; rm -rf "$SCRATCH"' EXIT
# Not eval "$(...)" alone: that would hide a cluster that failed to start.
exports=$("$SRC/scripts/slurm/local_cluster.sh" start "$CLUSTER") || fail "the local Slurm did not start"
eval "$exports"

# wait_gone JOB SECONDS: until squeue no longer lists the job (or its array tasks).
wait_gone() {
  local start=$SECONDS out
  while true; do
    # A busy controller can fail a query (a timeout): that is no answer, not an empty queue.
    if out=$(squeue -h -j "$1" 2>&1); then
      [[ -z "$out" ]] && return
    elif [[ "$out" == *"Invalid job id"* ]]; then
      return
    fi
    ((SECONDS - start < $2)) || { squeue >&2; fail "job $1 still queued after $2 s"; }
    sleep 0.5
  done
}

# 1. A sweep as one job array.
expect_exit 0 "$SRC/scripts/sweep" "$SRC/tests/configs/tiny_mlp.yaml" --grid optimizer.lr=0.05,0.01 \
  --grid train.steps=10,20 --out "$SCRATCH/sweep" -- --time=5
array=$(tail -1 "$SCRATCH/last.log")
[[ "$array" =~ ^[0-9]+$ ]] || { cat "$SCRATCH/last.log" >&2; fail "sbatch did not return a job id"; }
wait_gone "$array" 180
expect_exit 0 "$SRC/scripts/sweep" --status "$SCRATCH/sweep"
[[ $(grep -c "| done |" "$SCRATCH/last.log") -eq 4 ]] || { cat "$SCRATCH/last.log" >&2; fail "the array did not finish 4 points"; }
echo "sweep: 4 points ran as job array $array"

# 2. SIGUSR1 (what --signal=USR1@120 sends before the limit): checkpoint, exit 3, requeue, resume.
TRAIN=(tests/configs/tiny_gpt.yaml --set train.steps=800 --set train.checkpoint_every=0 --set train.eval_every=0
       --set train.log_every=1)
expect_exit 0 "$FLOWRUN" train "$SRC/${TRAIN[0]}" --run-dir "$SCRATCH/straight" --no-progress "${TRAIN[@]:1}"
job=$(sbatch --parsable --output="$SCRATCH/preempt.out" "$SRC/scripts/slurm/train.sbatch" "$SRC/${TRAIN[0]}" \
  --run-dir "$SCRATCH/preempt" "${TRAIN[@]:1}")
wait_logged "$SCRATCH/preempt/metrics.jsonl" 30
# Signal until the job is requeued (a signal that reaches the step before its tasks run is lost).
for _ in 1 2 3 4 5; do
  scancel --signal=USR1 "$job"
  for _ in $(seq 30); do
    [[ "$(squeue -h -j "$job" -o %T 2>/dev/null)" == PENDING ]] && break 2
    sleep 0.1
  done
done
grep -q "requeueing job $job" "$SCRATCH/preempt.out" || { cat "$SCRATCH/preempt.out" >&2; fail "the job was not requeued"; }
scontrol update JobId="$job" StartTime=now  # Slurm holds a requeued job ~2 minutes: release it now
wait_gone "$job" 180
grep -q "stopped at step [0-9]* (SIGUSR1)" "$SCRATCH/preempt.out" || fail "no clean stop on SIGUSR1"
grep -q "^done: 800 steps" "$SCRATCH/preempt.out" || {
  cat "$SCRATCH/preempt.out" >&2
  scontrol show job "$job" >&2 || true  # what Slurm made of it, for the next time this happens
  fail "the requeued job did not finish"
}
diff <(losses "$SCRATCH/straight/metrics.jsonl") <(losses "$SCRATCH/preempt/metrics.jsonl") ||
  fail "preempted + requeued run: per-step records differ from the uninterrupted run"
echo "SIGUSR1 $(grep -o 'stopped at step [0-9]*' "$SCRATCH/preempt.out"), requeued, resumed bit-exactly"

# 3. Two ranks under srun --mpi=pmix: train to step 10, then resume to the end.
SRUN=(srun --mpi=pmix -n 2 --overcommit "$FLOWRUN" train "$SRC/tests/configs/tiny_gpt.yaml" --no-progress
      --run-dir "$SCRATCH/srun" --set parallel.data=2)
expect_exit 0 "${SRUN[@]}" --exit-at-step 10
expect_log "stopped at step 10"
expect_exit 0 "${SRUN[@]}" --resume auto
expect_log "resumed from $SCRATCH/srun/checkpoints/step_00000010.h5"
expect_log "done: 20 steps"
[[ -f "$SCRATCH/srun/rank_1.log" ]] || fail "rank 1 kept no log"
echo "srun --mpi=pmix: 2 ranks trained and resumed"

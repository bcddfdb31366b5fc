#!/usr/bin/env bash
# Clean stops: SIGUSR1 mid-run checkpoints and exits 3, and --resume auto finishes with every per-step loss
# bit-identical to an uninterrupted run; train.max_wall_time does the same without a signal; a second SIGTERM
# ends the process at once; signals reach one thread only, and a storm of them during the products is
# harmless; async and synchronous checkpoints hold the same bits.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
CFG="$SRC/tests/configs/tiny_gpt.yaml"
COMMON=(--no-progress --set train.steps=400 --set train.checkpoint_every=0 --set train.eval_every=0)

expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/straight" "${COMMON[@]}"

# SIGUSR1 once 30 steps are logged.
"$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/usr1" "${COMMON[@]}" >"$SCRATCH/usr1.log" 2>&1 &
pid=$!
wait_logged "$SCRATCH/usr1/metrics.jsonl" 30
kill -USR1 "$pid"
code=0
wait "$pid" || code=$?
[[ $code -eq 3 ]] || { cat "$SCRATCH/usr1.log" >&2; fail "SIGUSR1: exit code $code, expected 3"; }
grep -q "stopped at step [0-9]* (SIGUSR1); checkpoint .*; continue with --resume auto" "$SCRATCH/usr1.log" ||
  { cat "$SCRATCH/usr1.log" >&2; fail "SIGUSR1: no stop message"; }
at=$(grep -o "stopped at step [0-9]*" "$SCRATCH/usr1.log" | awk '{print $4}')
((at < 400)) || fail "SIGUSR1 arrived after the run ended (step $at)"
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/usr1" "${COMMON[@]}" --resume auto
expect_log "resumed from"
diff <(losses "$SCRATCH/straight/metrics.jsonl") <(losses "$SCRATCH/usr1/metrics.jsonl") ||
  fail "SIGUSR1 at step $at + resume: per-step records differ from the uninterrupted run"
echo "SIGUSR1 at step $at: checkpointed, exit 3, resumed bit-exactly"

# The wall-time budget: each invocation stops itself after 0.3 s; three of them go on from each other.
for i in 1 2 3; do
  expect_exit 3 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/budget" "${COMMON[@]}" --set train.steps=100000 \
    --set train.max_wall_time=0.3 --resume auto
  expect_log "(train.max_wall_time 0.3 s)"
done
steps=$(ls "$SCRATCH/budget/checkpoints" | sed -n 's/step_0*\([0-9]*\)\.h5$/\1/p' | sort -n | tail -1)
((steps > 0)) || fail "the wall-time budget left no checkpoint"
echo "max_wall_time: three 0.3 s slices reached step $steps"

# A second SIGTERM does not wait for the checkpoint (a step of the bench GPT takes ~250 ms).
"$FLOWRUN" train "$SRC/configs/bench/gpt_tiny.yaml" --run-dir "$SCRATCH/term" --no-progress \
  --set train.log_every=1 >"$SCRATCH/term.log" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q "^step 2/" "$SCRATCH/term.log" && break; sleep 0.05; done
kill -TERM "$pid"
sleep 0.01
kill -TERM "$pid"
code=0
wait "$pid" || code=$?
[[ $code -eq 143 ]] || { tail -5 "$SCRATCH/term.log" >&2; fail "two SIGTERMs: exit code $code, expected 143"; }
echo "a second SIGTERM ended the run at once"

# Signals are taken by a thread of their own (core/signals.h): every other thread blocks them, so that no
# handler runs on a compute thread, whose stack pointer may point into a heap workspace (oneDNN's sgemm
# kernels below AVX-512). Before that, a storm of signals during gpt-tiny's products corrupted the heap
# (exit 134 or 139) in 6 of 8 tries on a loaded AVX2 host.
"$FLOWRUN" train "$SRC/configs/bench/gpt_tiny.yaml" --run-dir "$SCRATCH/storm" --no-progress \
  --set train.log_every=1 >"$SCRATCH/storm.log" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q "^step 1/" "$SCRATCH/storm.log" && break; sleep 0.05; done
threads=0 open=0
for status in /proc/$pid/task/*/status; do
  blocked=$(sed -n 's/^SigBlk:[[:space:]]*//p' "$status" 2>/dev/null) && [[ -n $blocked ]] || continue
  threads=$((threads + 1))
  # SIGINT (2), SIGUSR1 (10) and SIGTERM (15): bits 1, 9 and 14.
  (((0x$blocked & 0x4202) == 0x4202)) || open=$((open + 1))
done
((threads >= 2 && open == 1)) ||
  fail "signal routing: $open of $threads threads take SIGTERM, SIGUSR1 or SIGINT, expected 1"
for _ in $(seq 100); do
  kill -USR1 "$pid" 2>/dev/null || break
  sleep 0.002
done
code=0
wait "$pid" || code=$?
# Stopped by the first; the later ones, even those after the stop, are ignored (core/signals.h).
[[ $code -eq 3 ]] || { tail -5 "$SCRATCH/storm.log" >&2; fail "a storm of SIGUSR1: exit code $code, expected 3"; }
echo "signals: one thread of $threads takes them; a storm of 100 SIGUSR1 during the products left the heap whole"

# Async and synchronous checkpoints of the same run are the same bits.
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/sync" --no-progress --set train.async_checkpoint=false
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/async" --no-progress
for s in 15 20; do
  f=$(printf "step_%08d.h5" $s)
  h5diff "$SCRATCH/sync/checkpoints/$f" "$SCRATCH/async/checkpoints/$f" /params /params >/dev/null &&
    h5diff "$SCRATCH/sync/checkpoints/$f" "$SCRATCH/async/checkpoints/$f" /state /state >/dev/null ||
    fail "async checkpoint $f differs from the synchronous one"
done
grep -q '"blocked_s"' "$SCRATCH/async/metrics.jsonl" || fail "no checkpoint records in metrics.jsonl"
echo "async checkpoints equal synchronous ones"

# A diverging run (lr 1e6) stops on the first non-finite loss, and with --detect-anomaly on the first op
# whose output is not finite, naming it; the checkpoint before it stays intact.
BAD=(train "$SRC/tests/configs/tiny_mlp.yaml" --no-progress --set optimizer.lr=1e6 --set train.checkpoint_every=2)
expect_exit 1 "$FLOWRUN" "${BAD[@]}" --run-dir "$SCRATCH/nan"
expect_log "the loss is"
expect_exit 1 "$FLOWRUN" "${BAD[@]}" --run-dir "$SCRATCH/anomaly" --detect-anomaly
expect_log "(op linear) produced a non-finite value (--detect-anomaly)"
culprit=$(grep -o '[^ ]* (op [a-z_]*)' "$SCRATCH/last.log" | head -1)
expect_exit 0 "$FLOWRUN" inspect "$SCRATCH/anomaly/checkpoints/step_00000002.h5"
echo "non-finite values stop the run; --detect-anomaly names $culprit"

# --detect-anomaly checks the weight gradients too: it keeps them as values of the step (keep_gradients),
# where a compiled step with SGD momentum computes them straight into the momentum buffers
# (fuse_momentum_products), so its arena holds them and is the larger.
arena() { grep -o 'arena [0-9.]* MiB (train)' "$SCRATCH/last.log" | awk '{print $2}'; }
MOM=(train "$SRC/tests/configs/tiny_mlp.yaml" --no-progress --set optimizer.nesterov=false --set train.steps=1
  --set train.eval_every=0)
expect_exit 0 "$FLOWRUN" "${MOM[@]}" --run-dir "$SCRATCH/momentum"
fused=$(arena)
expect_exit 0 "$FLOWRUN" "${MOM[@]}" --run-dir "$SCRATCH/momentum-anomaly" --detect-anomaly
kept=$(arena)
# Below AVX-512 no product takes the momentum term in its one rounding (lib/ops/cpu/dnnl_matmul.h,
# dnnl_gemm_driver): nothing is fused and both steps keep the gradients.
if "$FLOWRUN" time "$SRC/tests/configs/tiny_mlp.yaml" --set optimizer.nesterov=false --steps 2 --profile 1 \
  2>&1 | grep -q '^sgd_product_update '; then
  awk -v a="$fused" -v b="$kept" 'BEGIN { exit !(a != "" && b > a) }' ||
    fail "--detect-anomaly's arena ($kept MiB) is not larger than the fused step's ($fused MiB)"
  echo "--detect-anomaly keeps the weight gradients: arena $kept MiB against $fused"
else
  [[ -n "$fused" && "$kept" == "$fused" ]] || fail "nothing fused, yet the arenas differ: $kept against $fused MiB"
  echo "no product fuses its momentum update on this CPU: both arenas $kept MiB"
fi

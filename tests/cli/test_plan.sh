#!/usr/bin/env bash
# `flowrun plan` against what a run holds (`flowrun time --json` of the same layout): parameter and state
# bytes exactly, the arena within 10%, the FLOPs per step, and the process's peak resident memory within 15%; in one process, under ZeRO-1 on 2 ranks,
# where each rank holds half of the optimizer state, under ZeRO-3, where it holds half of the parameters
# too, under TP2, where each holds its pieces, and for the first stage of PP2.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
CFG="$SRC/tests/configs/tiny_gpt.yaml"

num() { grep -o "\"$2\": [0-9.e+-]*" "$1" | head -1 | awk '{print $2}'; }
# time_json OUT: the JSON object of the last `flowrun time --json` under mpirun (rank 0 prints it; another
# rank's log may share its line), or a failure that shows the output: under `set -e` a grep that finds
# nothing would end the test without a word.
time_json() {
  grep -o '{"config".*' "$SCRATCH/last.log" | head -1 >"$1" || true
  [[ -s "$1" ]] || { cat "$SCRATCH/last.log" >&2; fail "no JSON line in the output of flowrun time --json"; }
}
same() { awk -v a="$2" -v b="$3" -v t="$4" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= t * b)}' ||
  fail "$1: plan $2, run $3 (tolerance $4)"; }

compare() {  # name plan-json time-json
  same "$1 parameter bytes" "$(num "$2" param_bytes)" "$(num "$3" param_bytes)" 0
  local state
  state=$(awk -v a="$(num "$2" optimizer_state_bytes)" -v b="$(num "$2" other_state_bytes)" 'BEGIN {print a + b}')
  same "$1 state bytes" "$state" "$(num "$3" state_bytes)" 0
  same "$1 arena" "$(num "$2" arena_bytes)" "$(awk -v m="$(num "$3" arena_mib)" 'BEGIN {print m * 1048576}')" 0.1
  same "$1 FLOPs" "$(num "$2" flops_per_step)" "$(num "$3" flops_per_step)" 1e-9
  same "$1 peak resident MiB" "$(num "$3" predicted_rss_mib)" "$(num "$3" peak_rss_mib)" 0.15
  printf '%s: plan matches the run (%s parameter bytes, %s state bytes; peak resident %.1f MiB, predicted %.1f)\n' \
    "$1" "$(num "$2" param_bytes)" "$state" "$(num "$3" peak_rss_mib)" "$(num "$3" predicted_rss_mib)"
}

expect_exit 0 "$FLOWRUN" plan "$CFG" --json
tail -1 "$SCRATCH/last.log" >"$SCRATCH/plan1.json"
expect_log "collectives: none"
expect_exit 0 "$FLOWRUN" time "$CFG" --steps 2 --warmup 0 --profile 0 --json
tail -1 "$SCRATCH/last.log" >"$SCRATCH/time1.json"
compare "one process" "$SCRATCH/plan1.json" "$SCRATCH/time1.json"

# against_run NAME N ARGS...: `flowrun plan` of the 2-rank layout ARGS against `flowrun time` of it under
# mpirun (rank 0's figures); keeps $SCRATCH/planN.json, planN.log (the plan's output) and timeN.json.
against_run() {
  local name=$1 n=$2
  shift 2
  expect_exit 0 "$FLOWRUN" plan "$CFG" --world-size 2 "$@" --json
  cp "$SCRATCH/last.log" "$SCRATCH/plan$n.log"
  tail -1 "$SCRATCH/last.log" >"$SCRATCH/plan$n.json"
  expect_exit 0 mpirun --allow-run-as-root --oversubscribe -np 2 "$FLOWRUN" time "$CFG" --steps 2 --warmup 0 \
    --profile 0 --json "$@"
  time_json "$SCRATCH/time$n.json"
  compare "$name" "$SCRATCH/plan$n.json" "$SCRATCH/time$n.json"
}
plan_says() { grep -qF -- "$2" "$SCRATCH/plan$1.log" || { cat "$SCRATCH/plan$1.log" >&2; fail "plan $1 lacks '$2'"; }; }
# half N FIELD WHAT: plan N's FIELD is half of one process's (shards round up, so at least half).
half() {
  awk -v z="$(num "$SCRATCH/plan$1.json" "$2")" -v o="$(num "$SCRATCH/plan1.json" "$2")" \
    'BEGIN {exit !(z >= o / 2 && z < o / 2 + 4096)}' || fail "$3 is not half of one process's"
}

against_run "ZeRO-1 on 2 ranks" 2 --set parallel.data=2 --set parallel.zero=1
plan_says 2 "all_gather_into"
half 2 optimizer_state_bytes "ZeRO-1 state"  # AdamW: two moments

# ZeRO-3 on 2 ranks: each holds half of every parameter too, and gathers them.
against_run "ZeRO-3 on 2 ranks" 5 --set parallel.data=2 --set parallel.zero=3
plan_says 5 "parameters (ZeRO-3: forward, backward)"
half 5 param_bytes "ZeRO-3 parameters"

# Tensor parallelism on 2 ranks: each holds its pieces of the split parameters (and their state).
against_run TP2 3 --set parallel.tensor=2
plan_says 3 "sbp_all_reduce"
plan_says 3 "blocks.0/attn/qkv/w [96,32] S(0)x3"
awk -v t="$(num "$SCRATCH/plan3.json" param_bytes)" -v o="$(num "$SCRATCH/plan1.json" param_bytes)" \
  'BEGIN {exit !(t < 0.7 * o)}' || fail "TP2 parameters are not split (plan: $(num "$SCRATCH/plan3.json" param_bytes) bytes)"

# Two pipeline stages: rank 0 holds the first stage's parameters and one arena per micro-batch slot.
against_run "PP2 stage 0" 4 --set parallel.pipeline=2 --set parallel.micro_batches=4
plan_says 4 "pipeline stage 0 of 2: 2 micro-batch slots"

expect_exit 2 "$FLOWRUN" plan "$CFG" --world-size 3 --set parallel.tensor=2

# A Llama-7B-shaped model is planned without allocating it, with the published parameter counts: Llama-2-7B
# and, with 8 key/value heads and a 14336-wide SwiGLU, Mistral-7B.
expect_exit 0 "$FLOWRUN" plan "$SRC/configs/bench/llama2_7b.yaml"
expect_log "6,738,415,616"
expect_exit 0 "$FLOWRUN" plan "$SRC/configs/bench/llama2_7b.yaml" --set model.n_kv_head=8 --set model.ffn=14336
expect_log "7,241,732,096"
echo "Llama-2-7B and Mistral-7B shapes: the published parameter counts"

# Attention whose heads the tensor axis does not divide is named; the MLP around it is split all the same
# (column- then row-parallel), so parameter memory is divided; a Megatron-split GPT is not warned about.
expect_exit 0 "$FLOWRUN" plan "$SRC/configs/bench/gpt_tiny.yaml" --set model.n_head=3 --set model.d_model=96 \
  --set parallel.tensor=2
expect_log "warning: model.n_head 3 is not divisible by parallel.tensor 2: attention cannot be split by heads"
expect_log "blocks.0/mlp/fc/w [384,96] S(0)"
expect_log "blocks.0/mlp/proj/w [96,384] S(1)"
grep -q "leaves" "$SCRATCH/last.log" && fail "the MLP of a 3-head GPT under TP2 was left whole"
expect_exit 0 "$FLOWRUN" plan "$SRC/configs/bench/gpt_tiny.yaml" --set model.n_head=4 --set model.d_model=96 \
  --set parallel.tensor=2
grep -q "^warning:" "$SCRATCH/last.log" && fail "a Megatron-split GPT was warned about"
# Parameters left whole (here by the model's own `sbp: {w: B}`) are named, with the largest.
cat >"$SCRATCH/whole.yaml" <<EOF
model:
  layers:
    - flatten
    - linear: {out: 256, sbp: {w: B, b: B}}
    - relu
    - linear: {out: 10}
data: {dataset: fashion_mnist}
EOF
expect_exit 0 "$FLOWRUN" plan "$SCRATCH/whole.yaml" --set parallel.tensor=2
expect_log "warning: parallel.tensor 2 leaves"
expect_log "largest linear0/w [256,784]"
# train says it too (rank 0), before the first step.
expect_exit 0 mpirun --allow-run-as-root --oversubscribe -np 2 "$FLOWRUN" train "$SRC/configs/kjv_gpt.yaml" \
  --run-dir "$SCRATCH/tp3" --set model.n_layer=2 --set model.n_head=3 --set model.d_model=96 \
  --set data.seq_len=32 --set train.batch_size=4 --set train.steps=1 --set data.eval_batches=1 \
  --set schedule.warmup_steps=0 --set parallel.tensor=2 --no-progress
expect_log "attention cannot be split by heads"
echo "attention whose heads the axis does not divide, and parameters left whole, are warned about"

# The process: with its dataset (53 MiB of Fashion-MNIST held in memory), oneDNN's convolution buffers and
# the evaluation program, the predicted peak resident memory is within 15% of the measured one, in `flowrun
# time` and in a training run (its log line against `flowrun plan`'s figure from another process).
CNN="$SRC/configs/bench/cnn.yaml"
expect_exit 0 "$FLOWRUN" time "$CNN" --steps 1 --warmup 0 --profile 0 --json
tail -1 "$SCRATCH/last.log" >"$SCRATCH/time_cnn.json"
same "cnn (time) peak resident MiB" "$(num "$SCRATCH/time_cnn.json" predicted_rss_mib)" \
  "$(num "$SCRATCH/time_cnn.json" peak_rss_mib)" 0.15
expect_exit 0 "$FLOWRUN" plan "$CNN" --set train.steps=4 --set train.eval_every=2 --set data.eval_batches=2 --json
expect_log "dataset (held in memory or mapped)                      52.87 MiB"
expect_log "oneDNN buffers (convolution scratchpad, reorders)"
predicted=$(num <(tail -1 "$SCRATCH/last.log") predicted_peak_rss_bytes)
expect_exit 0 "$FLOWRUN" train "$CNN" --run-dir "$SCRATCH/cnn" --set train.steps=4 --set train.eval_every=2 \
  --set data.eval_batches=2 --no-progress
line=$(grep -o "memory: peak resident [0-9.]* MiB (flowrun plan predicted [0-9.]* MiB)" "$SCRATCH/last.log") ||
  fail "train logs no measured and predicted peak"
measured=$(awk '{print $4}' <<<"$line")
same "cnn (train) peak resident MiB" "$(awk -v b="$predicted" 'BEGIN {print b / 1048576}')" "$measured" 0.15
same "cnn (train) the run's own prediction" "$(awk '{print $9}' <<<"$line")" "$measured" 0.15
echo "cnn: $line; flowrun plan: $(awk -v b="$predicted" 'BEGIN {printf "%.1f", b / 1048576}') MiB"

#!/usr/bin/env bash
# Eager mode (train.eager, --eager) as the compiled step's oracle: for every zoo model the compiled, fused,
# planned step and the eager one (node by node, unfused, no recompute, every value in memory of its own) log
# the same losses and end with the same weights and optimizer state, bit for bit, at a fixed thread count; so
# do recompute, bf16 with accumulation, fp16 with loss scaling (its overflowing backward passes are not
# errors), and data (ZeRO-3), tensor and pipeline parallelism. An eager run stops at the first op to make an
# inf or NaN, naming it and its inputs; `time` and `eval` take --eager; the eager arena shares nothing.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
T="$SRC/tests/configs"
MPI=(mpirun --allow-run-as-root --oversubscribe -np 2)
COMMON=(--set train.steps=3 --set train.log_every=1 --set train.checkpoint_every=0 --set train.eval_every=0
  --no-progress)

# case NAME LAUNCH... -- ARGS...: trains compiled and --eager, and compares the runs bitwise (the resolved
# config, an attribute of the checkpoint's root, differs in train.eager).
case_() {
  local name=$1; shift
  local launch=()
  while [[ $1 != -- ]]; do launch+=("$1"); shift; done
  shift
  local a="$SCRATCH/$name-compiled" b="$SCRATCH/$name-eager"
  expect_exit 0 "${launch[@]}" "$FLOWRUN" train "$@" --run-dir "$a" "${COMMON[@]}"
  expect_exit 0 "${launch[@]}" "$FLOWRUN" train "$@" --run-dir "$b" "${COMMON[@]}" --eager
  expect_log "eager: time per op over 3 steps"
  cmp -s <(losses "$a/metrics.jsonl") <(losses "$b/metrics.jsonl") || fail "$name: the losses differ"
  h5diff --exclude-attribute / "$(ls "$a"/checkpoints/*.h5 | tail -1)" "$(ls "$b"/checkpoints/*.h5 | tail -1)" \
    >"$SCRATCH/h5diff.log" || { head -20 "$SCRATCH/h5diff.log" >&2; fail "$name: the final checkpoints differ"; }
  echo "$name: compiled and eager bitwise equal ($(grep -c '"loss"' "$a/metrics.jsonl") losses, every tensor)"
}

ONE=(--set train.threads=2)
case_ mlp -- "$T/tiny_mlp.yaml" "${ONE[@]}"
# Momentum without Nesterov: the weight gradients go into the momentum buffers (fuse_momentum_products).
case_ mlp-momentum -- "$T/tiny_mlp.yaml" "${ONE[@]}" --set optimizer.nesterov=false
# 256 rows: the relu's gradient and its bias sum are one relu_bias_grad (not below 256).
case_ mlp-256 -- "$T/tiny_mlp.yaml" "${ONE[@]}" --set train.batch_size=256
case_ mlp-256-bf16 -- "$T/tiny_mlp.yaml" "${ONE[@]}" --set train.batch_size=256 --set precision.dtype=bf16
case_ cnn -- "$SRC/configs/bench/cnn.yaml" "${ONE[@]}" --set train.batch_size=16
case_ resnet -- "$SRC/configs/bench/resnet.yaml" "${ONE[@]}" --set train.batch_size=8
case_ gpt -- "$T/tiny_gpt.yaml" "${ONE[@]}"
case_ bert -- "$T/tiny_bert.yaml" "${ONE[@]}"
case_ llama -- "$T/tiny_llama.yaml" "${ONE[@]}"
case_ vit -- "$T/tiny_vit.yaml" "${ONE[@]}"
case_ gpt-recompute -- "$T/tiny_gpt.yaml" "${ONE[@]}" --set train.recompute=blocks
case_ gpt-bf16-accumulation -- "$T/tiny_gpt.yaml" "${ONE[@]}" --set precision.dtype=bf16 \
  --set train.micro_batch_size=4 --set train.grad_accumulation=2
case_ resnet-bf16 -- "$SRC/configs/bench/resnet.yaml" "${ONE[@]}" --set train.batch_size=8 --set precision.dtype=bf16
# A scale that overflows: steps are skipped in both runs, and the eager one does not stop at the overflow.
case_ gpt-fp16 -- "$T/tiny_gpt.yaml" "${ONE[@]}" --set precision.dtype=fp16 --set precision.initial_scale=1e6
grep -q '"skipped_steps": [1-9]' "$SCRATCH/gpt-fp16-eager/metrics.jsonl" || fail "gpt-fp16: no step was skipped"

TWO=(--set train.threads=1)
case_ gpt-dp2-zero3 "${MPI[@]}" -- "$T/tiny_gpt.yaml" "${TWO[@]}" --set parallel.data=2 --set parallel.zero=3
case_ gpt-tp2 "${MPI[@]}" -- "$T/tiny_gpt.yaml" "${TWO[@]}" --set parallel.tensor=2
# SGD with momentum and weight decay, unclipped: each rank's weight gradients go into its momentum shards.
case_ gpt-tp2-sgd "${MPI[@]}" -- "$T/tiny_gpt.yaml" "${TWO[@]}" --set parallel.tensor=2 --set train.clip_grad_norm=0 \
  --set optimizer.type=sgd --set optimizer.momentum=0.9 --set optimizer.weight_decay=0.01
case_ gpt-pp2 "${MPI[@]}" -- "$T/tiny_gpt.yaml" "${TWO[@]}" --set parallel.pipeline=2 --set parallel.micro_batches=4

# A learning rate that overflows the weights: the eager run stops at the first op to make an inf, with the
# magnitudes of its inputs, and keeps no checkpoint of the broken weights.
expect_exit 1 "$FLOWRUN" train "$T/tiny_mlp.yaml" --run-dir "$SCRATCH/overflow" --no-progress \
  --set optimizer.lr=1e30 --eager
expect_log "step 2: head/linear (op linear) produced a non-finite value"
expect_log "input  head/w [10, 64] f32: finite, largest finite magnitude"
expect_log "output head/linear [64, 10] f32: 640 of 640 non-finite"
expect_log "stopping (train.eager); this run has no good checkpoint"

# time and eval.
expect_exit 0 "$FLOWRUN" time "$T/tiny_gpt.yaml" --eager --steps 2 --warmup 1 --profile 1
expect_log "), eager"
expect_log "sdpa_grad"
expect_exit 0 "$FLOWRUN" eval "$T/tiny_gpt.yaml" --eager --set data.eval_batches=2 \
  --checkpoint "$(ls "$SCRATCH"/gpt-eager/checkpoints/*.h5 | tail -1)"
expect_log "eager: time per op over 2 batches"
compiled=$("$FLOWRUN" eval "$T/tiny_gpt.yaml" --set data.eval_batches=2 \
  --checkpoint "$(ls "$SCRATCH"/gpt-eager/checkpoints/*.h5 | tail -1)" | grep '^eval ')
[[ "$compiled" == "$(grep '^eval ' "$SCRATCH/last.log")" ]] || fail "eval: compiled and eager scores differ"

# The eager arena holds every value: more than the planned one (flowrun plan), and as much as all of them.
arena() { "$FLOWRUN" plan "$T/tiny_gpt.yaml" "$@" --json | tail -1 | grep -o '"arena_bytes": [0-9]*' | awk '{print $2}'; }
planned=$(arena) eager=$(arena --set train.eager=true)
[[ $eager -gt $((2 * planned)) ]] || fail "the eager arena ($eager bytes) is not above twice the planned ($planned)"
echo "arena: planned $planned bytes, eager $eager"

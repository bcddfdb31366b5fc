#!/usr/bin/env bash
# Training on the GPU against the CPU (label gpu: needs a GPU; scripts/gpu_check.sh runs it). From the same
# seed, quickstart's MLP (AdamW, on the wine table), the Fashion-MNIST CNN (dropout, an evaluation), a
# ResNet-8 (batchnorm, SGD momentum) and a small GPT (AdamW, dropout, clipping, tied embeddings; an
# evaluation at step 10) log per-step losses within 1e-3 relative of the CPU's (cuBLAS and oneDNN sum in
# other orders; dropout draws the same masks on both), and the optimizer state of step 1 (the first
# gradients: Adam's moments, SGD's momentum) agrees within 1e-3; the GPT in bf16 and in fp16 (loss scaling)
# stays within 3e-2 of the CPU's run in the same precision.
# Each is compared for as long as its training is not chaotic, where rounding grows without bound: 20 steps,
# but the ResNet's 8 (at lr 0.01: batchnorm over 8 images multiplies a difference several times a step; an
# lr changed by 1e-3 relative moves its loss by 0.6% by step 15 on the CPU alone) and the low-precision
# GPTs' 12 (both devices' runs spike, at steps 16 to 18). Not the weights of the last step either: on the CPU
# alone, an lr changed by 1e-8 relative moves the CNN's step-20 Adam moments by 1%. Nor the weights of step
# 1 (they are printed): Adam's first update is lr g / (|g| + eps), which turns a gradient near eps into any
# update up to lr, and such gradients are rounding: the key third of the GPT's qkv bias (softmax ignores a
# shift shared by every key, so its exact gradient is 0), fp16 gradients that one device rounds to 0.
# The GPU runs replay CUDA graphs (train.cuda_graph, the default); the GPT run again without them must log
# the very same losses (the same kernels on the same inputs), dropout drawing new masks each step either way.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
COMMON=(--no-progress --set train.log_every=1 --set train.steps=20 --set schedule.warmup_steps=5
  --set train.checkpoint_every=1 --set train.keep_checkpoints=20)
GPT=("$SRC/configs/kjv_gpt.yaml" --set model.n_layer=2 --set model.dropout=0.1 --set train.batch_size=8
  --set train.eval_every=10 --set data.eval_batches=2)

# name tolerance config args...: the run on each device, then their losses and step-1 optimizer states compared
# (args after COMMON: a case may set fewer steps).
gpu_vs_cpu() {
  local name=$1 tol=$2 config=$3
  shift 3
  for device in cpu cuda; do
    expect_exit 0 "$FLOWRUN" train "$config" "${COMMON[@]}" "$@" --run-dir "$SCRATCH/$name-$device" \
      --set train.device=$device
    cp "$SCRATCH/last.log" "$SCRATCH/$name-$device.out"
  done
  local rel
  rel=$(max_rel "$SCRATCH/$name-cpu/metrics.jsonl" "$SCRATCH/$name-cuda/metrics.jsonl")
  # Both runs' losses side by side in the log: where they part says more than their largest difference.
  paste <(grep -o '"step": [0-9]*, "loss": [0-9.e+-]*' "$SCRATCH/$name-cpu/metrics.jsonl") \
    <(grep -o '"loss": [0-9.e+-]*' "$SCRATCH/$name-cuda/metrics.jsonl")
  within "$rel" "$tol" || fail "$name: the GPU's losses differ from the CPU's by $rel (allowed $tol)"
  echo "$name: GPU losses within $rel of the CPU's"
  "$FLOWRUN" inspect "$SCRATCH/$name-cpu/checkpoints/step_00000001.h5" \
    --diff "$SCRATCH/$name-cuda/checkpoints/step_00000001.h5" --rtol "$tol" >"$SCRATCH/diff.log" 2>&1 || true
  cat "$SCRATCH/diff.log"
  grep -qE '^(same within|DIFFERENT beyond)' "$SCRATCH/diff.log" || fail "$name: flowrun inspect --diff failed"
  ! grep '^state/.*: max |a - b|' "$SCRATCH/diff.log" ||
    fail "$name: the GPU's step-1 optimizer state differs from the CPU's beyond rtol $tol"
  echo "$name: the GPU's step-1 optimizer state (its first gradients) within rtol $tol of the CPU's"
}

# Every case runs, each in a subshell, and the test fails at the end naming each that failed: a GPU is lent
# rarely and briefly, so one run must show every failure, not the first.
FAILED=()
case_() { (set -e; "$@") || FAILED+=("${*:1:3}"); }
case_ gpu_vs_cpu mlp 1e-3 "$SRC/configs/quickstart.yaml" --set data.dataset=wine --set train.batch_size=16
# The convnets (cuDNN convolutions, pooling, batchnorm), SGD momentum for the ResNet.
case_ gpu_vs_cpu cnn 1e-3 "$SRC/configs/fashion_cnn.yaml" --set train.batch_size=16 --set train.eval_every=10
case_ gpu_vs_cpu resnet 1e-3 "$SRC/configs/bench/resnet.yaml" --set data.dataset=fashion_mnist \
  --set 'data.path=""' --set model.depth=8 --set train.batch_size=8 --set optimizer.lr=0.01 --set train.steps=8
case_ gpu_vs_cpu gpt 1e-3 "${GPT[@]}"
case_ gpu_vs_cpu gpt-bf16 3e-2 "${GPT[@]}" --set precision.dtype=bf16 --set train.steps=12
case_ gpu_vs_cpu gpt-fp16 3e-2 "${GPT[@]}" --set precision.dtype=fp16 --set train.steps=12

graphs() {
  grep -q '"val_loss"' "$SCRATCH/gpt-cuda/metrics.jsonl" || fail "the GPU run logged no evaluation"
  expect_exit 0 "$FLOWRUN" train "${GPT[@]}" --run-dir "$SCRATCH/gpt-nograph" "${COMMON[@]}" \
    --set train.device=cuda --set train.cuda_graph=false
  local rel
  rel=$(max_rel "$SCRATCH/gpt-cuda/metrics.jsonl" "$SCRATCH/gpt-nograph/metrics.jsonl")
  within "$rel" 0 || fail "the GPT's losses with and without CUDA graphs differ by $rel"
  ! grep -q "could not be captured" "$SCRATCH"/*-cuda.out || fail "a training step was not captured as a CUDA graph"
  echo "gpt: the same losses with and without CUDA graphs"
}
case_ graphs cuda-graphs

# A checkpoint written on one device resumes on the other: the GPT's step-10 checkpoint of each run goes on
# for steps 11 to 20 on the other device, whose losses must be the writer's own within the GPU-CPU tolerance.
cross_resume() {
  local from=$1 to=$2 rel
  expect_exit 0 "$FLOWRUN" train "${GPT[@]}" --run-dir "$SCRATCH/gpt-$from-on-$to" "${COMMON[@]}" \
    --set train.device=$to --resume "$SCRATCH/gpt-$from/checkpoints/step_00000010.h5"
  grep '"loss"' "$SCRATCH/gpt-$from/metrics.jsonl" | sed -n '11,$p' >"$SCRATCH/$from-after10.jsonl"
  rel=$(max_rel "$SCRATCH/$from-after10.jsonl" "$SCRATCH/gpt-$from-on-$to/metrics.jsonl")
  within "$rel" 1e-3 || fail "the $from checkpoint resumed on $to: losses differ from the $from run's by $rel"
  echo "gpt: the $from checkpoint of step 10 resumes on $to, losses within $rel of the $from run's"
}
case_ cross_resume cpu cuda
case_ cross_resume cuda cpu
((${#FAILED[@]} == 0)) || fail "failed: $(IFS=,; echo "${FAILED[*]}")"

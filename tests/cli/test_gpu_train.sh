#!/usr/bin/env bash
# Training on the GPU against the CPU (label gpu: needs a GPU; scripts/gpu_check.sh runs it). From the same
# seed, 20 steps of quickstart's MLP (AdamW, on the wine table), of the Fashion-MNIST CNN (dropout, an
# evaluation), of a ResNet-8 (batchnorm, SGD momentum) and of a small GPT (AdamW, dropout, clipping, tied
# embeddings; an evaluation at step 10) log per-step losses within 1e-3 relative of the CPU's (cuBLAS
# and oneDNN sum in other orders; dropout draws the same masks on both) and end with the same weights within
# 1e-3; the GPT in bf16 and in fp16 (loss scaling) stays within 3e-2 of the CPU's run in the same precision.
# The GPU runs replay CUDA graphs (train.cuda_graph, the default); the GPT run again without them must log
# the very same losses (the same kernels on the same inputs), dropout drawing new masks each step either way.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
COMMON=(--no-progress --set train.log_every=1 --set train.steps=20 --set schedule.warmup_steps=5)
GPT=("$SRC/configs/kjv_gpt.yaml" --set model.n_layer=2 --set model.dropout=0.1 --set train.batch_size=8
  --set train.eval_every=10 --set data.eval_batches=2 --set train.checkpoint_every=20)

# name tolerance config args...: the run on each device, then their losses and last checkpoints compared.
gpu_vs_cpu() {
  local name=$1 tol=$2
  shift 2
  for device in cpu cuda; do
    expect_exit 0 "$FLOWRUN" train "$@" --run-dir "$SCRATCH/$name-$device" "${COMMON[@]}" --set train.device=$device
    cp "$SCRATCH/last.log" "$SCRATCH/$name-$device.out"
  done
  local rel
  rel=$(max_rel "$SCRATCH/$name-cpu/metrics.jsonl" "$SCRATCH/$name-cuda/metrics.jsonl")
  within "$rel" "$tol" || fail "$name: the GPU's losses differ from the CPU's by $rel (allowed $tol)"
  local a b
  a=$(ls "$SCRATCH/$name-cpu/checkpoints/"*.h5 | tail -1) b=$(ls "$SCRATCH/$name-cuda/checkpoints/"*.h5 | tail -1)
  expect_exit 0 "$FLOWRUN" inspect "$a" --diff "$b" --rtol "$tol"
  echo "$name: GPU losses within $rel of the CPU's; weights within rtol $tol"
}

gpu_vs_cpu mlp 1e-3 "$SRC/configs/quickstart.yaml" --set data.dataset=wine --set train.batch_size=16 \
  --set train.checkpoint_every=20
# The convnets (cuDNN convolutions, pooling, batchnorm), SGD momentum for the ResNet.
gpu_vs_cpu cnn 1e-3 "$SRC/configs/fashion_cnn.yaml" --set train.batch_size=16 --set train.eval_every=10 \
  --set train.checkpoint_every=20
gpu_vs_cpu resnet 1e-3 "$SRC/configs/bench/resnet.yaml" --set data.dataset=fashion_mnist --set 'data.path=""' \
  --set model.depth=8 --set train.batch_size=8 --set train.checkpoint_every=20
gpu_vs_cpu gpt 1e-3 "${GPT[@]}"
gpu_vs_cpu gpt-bf16 3e-2 "${GPT[@]}" --set precision.dtype=bf16
gpu_vs_cpu gpt-fp16 3e-2 "${GPT[@]}" --set precision.dtype=fp16
grep -q '"val_loss"' "$SCRATCH/gpt-cuda/metrics.jsonl" || fail "the GPU run logged no evaluation"

expect_exit 0 "$FLOWRUN" train "${GPT[@]}" --run-dir "$SCRATCH/gpt-nograph" "${COMMON[@]}" --set train.device=cuda \
  --set train.cuda_graph=false
rel=$(max_rel "$SCRATCH/gpt-cuda/metrics.jsonl" "$SCRATCH/gpt-nograph/metrics.jsonl")
within "$rel" 0 || fail "the GPT's losses with and without CUDA graphs differ by $rel"
! grep -q "could not be captured" "$SCRATCH"/*-cuda.out || fail "a training step was not captured as a CUDA graph"
echo "gpt: the same losses with and without CUDA graphs"

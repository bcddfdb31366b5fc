#!/usr/bin/env bash
# Data parallelism between GPUs through NCCL (label gpu; needs two GPUs and mpirun, and is skipped, exit 77,
# without them: NCCL refuses two ranks on one GPU). A small GPT (AdamW, dropout, clipping) trained 20 steps
# on two GPUs, plain and with ZeRO-2 (sharded optimizer state, reduce-scattered gradients, the sharded
# gradient norm), under tensor parallelism (Megatron's layout, the vocabulary-parallel cross-entropy) and as
# two pipeline stages (4 micro-batches, tied embeddings across the stages), logs the losses of the same run
# on one GPU within 1e-4 relative.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [[ "$gpus" -lt 2 ]] || ! command -v mpirun >/dev/null; then
  echo "skipped: needs two GPUs (found ${gpus:-0}) and mpirun"
  exit 77
fi
COMMON=(--no-progress --set train.log_every=1 --set train.steps=20 --set train.eval_every=0
  --set model.n_layer=2 --set model.dropout=0.1 --set train.batch_size=8 --set train.clip_grad_norm=1.0
  --set train.device=cuda)
expect_exit 0 "$FLOWRUN" train "$SRC/configs/kjv_gpt.yaml" --run-dir "$SCRATCH/one" "${COMMON[@]}"
expect_exit 0 mpirun --allow-run-as-root --oversubscribe -np 2 "$FLOWRUN" train "$SRC/configs/kjv_gpt.yaml" \
  --run-dir "$SCRATCH/tp2" "${COMMON[@]}" --set parallel.tensor=2
rel=$(max_rel "$SCRATCH/one/metrics.jsonl" "$SCRATCH/tp2/metrics.jsonl")
within "$rel" 1e-4 || fail "TP2 on two GPUs differs from one GPU by $rel"
echo "TP2 on two GPUs: losses within $rel of one GPU's"
for zero in 0 2; do
  expect_exit 0 mpirun --allow-run-as-root --oversubscribe -np 2 "$FLOWRUN" train "$SRC/configs/kjv_gpt.yaml" \
    --run-dir "$SCRATCH/dp2-zero$zero" "${COMMON[@]}" --set parallel.data=2 --set parallel.zero=$zero
  rel=$(max_rel "$SCRATCH/one/metrics.jsonl" "$SCRATCH/dp2-zero$zero/metrics.jsonl")
  within "$rel" 1e-4 || fail "DP2 (zero $zero) on two GPUs differs from one GPU by $rel"
  echo "DP2 (zero $zero) on two GPUs: losses within $rel of one GPU's"
done
expect_exit 0 "$FLOWRUN" train "$SRC/configs/kjv_gpt.yaml" --run-dir "$SCRATCH/one-accum4" "${COMMON[@]}" \
  --set train.grad_accumulation=4
expect_exit 0 mpirun --allow-run-as-root --oversubscribe -np 2 "$FLOWRUN" train "$SRC/configs/kjv_gpt.yaml" \
  --run-dir "$SCRATCH/pp2" "${COMMON[@]}" --set parallel.pipeline=2 --set parallel.micro_batches=4 \
  --set train.grad_accumulation=4
rel=$(max_rel "$SCRATCH/one-accum4/metrics.jsonl" "$SCRATCH/pp2/metrics.jsonl")
within "$rel" 1e-4 || fail "PP2 on two GPUs differs from one GPU by $rel"
echo "PP2 on two GPUs: losses within $rel of one GPU's"

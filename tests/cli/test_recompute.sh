#!/usr/bin/env bash
# Activation recompute (train.recompute, a layer's `recompute: true`): bitwise the losses and weights of the
# run without it, with dropout, in one process and under tensor, pipeline and data parallelism (ZeRO-2), in
# bf16 and fp16, and for ResNet's batchnorm blocks (running statistics updated once); the planned arena of an
# 8-layer GPT at least halves; bad values exit 2.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
GPT="$SRC/tests/configs/tiny_gpt.yaml"
MPI=(mpirun --allow-run-as-root --oversubscribe -np 2)
COMMON=(--set train.steps=8 --set train.checkpoint_every=0 --set train.eval_every=0 --no-progress)

# bitwise NAME A B: runs A and B logged the same losses and ended with the same tensors, bit for bit (the
# resolved config, an attribute of the file's root, names the recompute setting and may differ).
bitwise() {
  cmp -s <(losses "$2/metrics.jsonl") <(losses "$3/metrics.jsonl") || fail "$1: the losses differ"
  h5diff --exclude-attribute / "$(ls "$2"/checkpoints/*.h5 | tail -1)" "$(ls "$3"/checkpoints/*.h5 | tail -1)" \
    >"$SCRATCH/h5diff.log" || { head -20 "$SCRATCH/h5diff.log" >&2; fail "$1: the final checkpoints differ"; }
  echo "$1: $(grep -c '"loss"' "$2/metrics.jsonl") losses and every tensor bitwise equal"
}

# case NAME LAUNCH... -- ARGS...: trains without recompute and with each mode, and compares.
case_() {
  local name=$1; shift
  local launch=()
  while [[ $1 != -- ]]; do launch+=("$1"); shift; done
  shift
  local mode
  for mode in none blocks full; do
    expect_exit 0 "${launch[@]}" "$FLOWRUN" train "$@" --run-dir "$SCRATCH/$name-$mode" "${COMMON[@]}" \
      --set train.recompute=$mode
  done
  bitwise "$name blocks" "$SCRATCH/$name-none" "$SCRATCH/$name-blocks"
  bitwise "$name full" "$SCRATCH/$name-none" "$SCRATCH/$name-full"
}

case_ gpt -- "$GPT"
case_ "gpt tp2" "${MPI[@]}" -- "$GPT" --set parallel.tensor=2
case_ "gpt pp2" "${MPI[@]}" -- "$GPT" --set parallel.pipeline=2 --set parallel.micro_batches=4
case_ "gpt dp2 zero2" "${MPI[@]}" -- "$GPT" --set parallel.data=2 --set parallel.zero=2
case_ "gpt bf16" -- "$GPT" --set precision.dtype=bf16
case_ "gpt fp16" -- "$GPT" --set precision.dtype=fp16
case_ resnet -- "$SRC/configs/bench/resnet.yaml" --set model.depth=8 --set train.batch_size=8 \
  --set train.log_every=1 --set data.eval_batches=1

# A layer of the model file asks for it: one block of an inline GPT.
cat >"$SCRATCH/inline.yaml" <<EOF
model:
  layers:
    - embedding: {name: wte, vocab: 256, dim: 32}
    - transformer_block: {name: b0, heads: 2, dropout: 0.1}
    - transformer_block: {name: b1, heads: 2, dropout: 0.1, recompute: true}
    - layernorm: {name: ln_f}
    - tied_head: {to: wte}
data: {dataset: kjv, seq_len: 32, eval_batches: 1}
train: {steps: 8, batch_size: 8, seed: 3, log_every: 1}
EOF
expect_exit 0 "$FLOWRUN" train "$SCRATCH/inline.yaml" --run-dir "$SCRATCH/inline-marked" --no-progress
sed 's/, recompute: true//' "$SCRATCH/inline.yaml" >"$SCRATCH/plain.yaml"
expect_exit 0 "$FLOWRUN" train "$SCRATCH/plain.yaml" --run-dir "$SCRATCH/inline-plain" --no-progress
bitwise "a layer's recompute: true" "$SCRATCH/inline-plain" "$SCRATCH/inline-marked"
plan_arena() {
  expect_exit 0 "$FLOWRUN" plan "$@" --json
  tail -1 "$SCRATCH/last.log" | grep -o '"arena_bytes": [0-9]*' | awk '{print $2}'
}
marked=$(plan_arena "$SCRATCH/inline.yaml") plain=$(plan_arena "$SCRATCH/plain.yaml")
awk -v a="$marked" -v b="$plain" 'BEGIN {exit !(a > 0 && a < b)}' ||
  fail "recompute: true on a layer did not shrink the planned arena ($marked bytes, $plain without)"
echo "one block marked: planned arena $marked bytes, $plain without"

# The planned arena of an 8-layer GPT (gpt-tiny's shapes) at least halves; `flowrun time` reports it too.
GPT8=("$SRC/configs/bench/gpt_tiny.yaml" --set model.n_layer=8)
none=$(plan_arena "${GPT8[@]}") blocks=$(plan_arena "${GPT8[@]}" --set train.recompute=blocks)
awk -v n="$none" -v b="$blocks" 'BEGIN {exit !(b > 0 && n >= 2 * b)}' ||
  fail "8-layer GPT: arena $blocks bytes with recompute, $none without: not halved"
echo "8-layer GPT: planned arena $none bytes without recompute, $blocks with blocks"
expect_exit 0 "$FLOWRUN" plan "${GPT8[@]}" --set train.recompute=blocks
expect_log "fp32, recompute blocks"
expect_exit 0 "$FLOWRUN" time "$GPT" --steps 2 --warmup 0 --profile 1 --set train.recompute=blocks
expect_log "), recompute blocks"

# Bad values: the key and the layer option, each named with its position.
expect_exit 2 "$FLOWRUN" check "$GPT" --set train.recompute=some
expect_log "train.recompute"
sed 's/recompute: true/recompute: maybe/' "$SCRATCH/inline.yaml" >"$SCRATCH/bad.yaml"
expect_exit 2 "$FLOWRUN" check "$SCRATCH/bad.yaml"
expect_log "bad.yaml:5"
expect_log "recompute"
echo "bad values exit 2, naming the key"

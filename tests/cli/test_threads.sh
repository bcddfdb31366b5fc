#!/usr/bin/env bash
# The thread count changes no result, which lets train.adapt_threads move it during a run: every zoo model
# (convnets in f32 and bf16, transformers, the MLP) trains 3 steps at 1, 2 and 3 threads to the same losses
# and checkpoint, bit for bit; so does a 1-layer GPT at batch 64 at 6 threads, whose weight-gradient products
# (K = 8192 tokens) oneDNN would split between threads by a plan made for their count. An adaptive run, whose
# probes run some steps at 1 thread, ends bitwise where a fixed 2-thread run does, and its metrics say at how
# many threads each step ran.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
T="$SRC/tests/configs"
COMMON=(--set train.log_every=1 --set train.checkpoint_every=0 --set train.eval_every=0 --no-progress)

# same_bits NAME A B: runs A and B logged the same losses and end with the same tensors.
same_bits() {
  cmp -s <(losses "$2/metrics.jsonl") <(losses "$3/metrics.jsonl") || fail "$1: the losses differ"
  h5diff --exclude-attribute / "$(ls "$2"/checkpoints/*.h5 | tail -1)" "$(ls "$3"/checkpoints/*.h5 | tail -1)" \
    >"$SCRATCH/h5diff.log" || { head -20 "$SCRATCH/h5diff.log" >&2; fail "$1: the final checkpoints differ"; }
}

# case NAME "COUNTS" CONFIG ARGS...: 3 steps at each thread count, each compared with the first.
case_() {
  local name=$1 counts=($2) cfg=$3; shift 3
  for n in "${counts[@]}"; do
    expect_exit 0 "$FLOWRUN" train "$cfg" "$@" --run-dir "$SCRATCH/$name-$n" "${COMMON[@]}" \
      --set train.steps=3 --set train.threads="$n" --set train.adapt_threads=false
    grep -q "\"threads\": $n," "$SCRATCH/$name-$n/metrics.jsonl" || fail "$name: a step did not run at $n threads"
    [[ $n == "${counts[0]}" ]] || same_bits "$name at ${counts[0]} and $n threads" "$SCRATCH/$name-${counts[0]}" \
      "$SCRATCH/$name-$n"
  done
  echo "$name: bitwise equal at ${counts[*]} threads"
}

case_ mlp "1 2 3" "$T/tiny_mlp.yaml"
case_ cnn "1 2 3" "$SRC/configs/bench/cnn.yaml" --set train.batch_size=24
case_ cnn-odd-batch "1 2" "$SRC/configs/bench/cnn.yaml" --set train.batch_size=37
case_ resnet "1 2 3" "$SRC/configs/bench/resnet.yaml" --set train.batch_size=12
case_ resnet-bf16 "1 2 3" "$SRC/configs/bench/resnet.yaml" --set train.batch_size=12 --set precision.dtype=bf16
case_ gpt "1 2 3" "$T/tiny_gpt.yaml"
case_ gpt-bf16 "1 2 3" "$T/tiny_gpt.yaml" --set precision.dtype=bf16
case_ bert "1 2 3" "$T/tiny_bert.yaml"
case_ llama "1 2 3" "$T/tiny_llama.yaml"
case_ vit "1 2 3" "$T/tiny_vit.yaml"
case_ gpt-long-k "1 6" "$SRC/configs/bench/gpt_tiny.yaml" --set model.n_layer=1 --set train.batch_size=64
case_ gpt-long-k-bf16 "1 6" "$SRC/configs/bench/gpt_tiny.yaml" --set model.n_layer=1 --set train.batch_size=64 \
  --set precision.dtype=bf16

# Adaptive against fixed: on an idle machine the probes run a few of the 40 steps at 1 thread.
ADAPT=(--set train.steps=40 --set train.threads=2)
expect_exit 0 "$FLOWRUN" train "$T/tiny_gpt.yaml" "${ADAPT[@]}" --run-dir "$SCRATCH/fixed" "${COMMON[@]}" \
  --set train.adapt_threads=false
expect_exit 0 "$FLOWRUN" train "$T/tiny_gpt.yaml" "${ADAPT[@]}" --run-dir "$SCRATCH/adaptive" "${COMMON[@]}"
expect_log "threads: at most 2 threads (adaptive: "
grep -q '"threads": 1,' "$SCRATCH/adaptive/metrics.jsonl" || fail "adaptive: no step ran at 1 thread"
grep -q '"threads": 1,' "$SCRATCH/fixed/metrics.jsonl" && fail "fixed: a step ran at 1 thread"
same_bits "adaptive and fixed" "$SCRATCH/fixed" "$SCRATCH/adaptive"
echo "adaptive: $(grep -c '"threads": 1,' "$SCRATCH/adaptive/metrics.jsonl") of 40 steps at 1 thread; bitwise equal to the fixed run"

# flowrun time reports the counts it ran at.
expect_exit 0 "$FLOWRUN" time "$T/tiny_mlp.yaml" --set train.threads=2 --steps 30 --profile 0 --json
expect_log "at most 2 threads (adaptive: "
grep -q '"threads_now": [12]' "$SCRATCH/last.log" || fail "time --json lacks threads_now"
echo "PASS"

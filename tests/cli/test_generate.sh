#!/usr/bin/env bash
# `flowrun generate`: text from a trained byte-level GPT and Llama, the same seed giving the same text,
# greedy and top-k 1 agreeing, bf16, a sharded checkpoint and a run directory as the source, the context
# window sliding past the training context, several samples, and bad input exiting 2. (That each step's
# logits equal the full forward pass's is tests/unit/test_generate.cc.)
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
TINY=(--set model.n_layer=1 --set model.n_head=2 --set model.d_model=32 --set data.seq_len=32
  --set train.batch_size=8 --set train.steps=6 --set train.eval_every=0 --set data.eval_batches=2
  --set schedule.warmup_steps=0 --set train.checkpoint_every=0 --no-progress)
GPT="$SRC/configs/kjv_gpt.yaml"
expect_exit 0 "$FLOWRUN" train "$GPT" --run-dir "$SCRATCH/gpt" "${TINY[@]}"
CK="$SCRATCH/gpt/checkpoints/step_00000006.h5"
MODEL=(--set model.n_layer=1 --set model.n_head=2 --set model.d_model=32 --set data.seq_len=32)

gen() {  # gen OUT ARGS...: generate with the tiny GPT's settings, stdout to OUT, stderr to OUT.err
  local out=$1; shift
  "$FLOWRUN" generate "$GPT" --checkpoint "$CK" "${MODEL[@]}" "$@" >"$out" 2>"$out.err" ||
    { cat "$out.err" >&2; fail "generate $* failed"; }
}

# The same seed gives the same text, another seed other text; the prompt comes first.
# (16 + 16 tokens fill the context of 32 exactly.)
gen "$SCRATCH/a" --prompt "In the beginning" --max-new-tokens 16 --seed 1
gen "$SCRATCH/b" --prompt "In the beginning" --max-new-tokens 16 --seed 1
gen "$SCRATCH/c" --prompt "In the beginning" --max-new-tokens 16 --seed 2
cmp -s "$SCRATCH/a" "$SCRATCH/b" || fail "the same seed gave different text"
cmp -s "$SCRATCH/a" "$SCRATCH/c" && fail "seeds 1 and 2 gave the same text"
[[ $(head -c 16 "$SCRATCH/a") == "In the beginning" ]] || fail "the output does not start with the prompt"
# 16 + 16 bytes and the final newline.
[[ $(wc -c <"$SCRATCH/a") -eq 33 ]] || fail "expected 33 bytes of output, got $(wc -c <"$SCRATCH/a")"
grep -qE '^flowrun: 16 tokens \(1 sample\) in .* tokens/s; prompt of 16 tokens prefilled' "$SCRATCH/a.err" ||
  { cat "$SCRATCH/a.err" >&2; fail "no tokens/s summary on stderr"; }
grep -q 'step lengths 1 16)' "$SCRATCH/a.err" || fail "expected the decode and prefill programs (lengths 1 and 16)"

# Greedy decoding is top-k 1 at any temperature.
gen "$SCRATCH/g" --prompt "And God said" --max-new-tokens 12 --temperature 0
gen "$SCRATCH/k" --prompt "And God said" --max-new-tokens 12 --top-k 1 --seed 9
cmp -s "$SCRATCH/g" "$SCRATCH/k" || fail "temperature 0 and top-k 1 differ"

# Past the training context (32) the window slides; each new length is compiled once.
gen "$SCRATCH/long" --prompt "In" --max-new-tokens 70 --top-p 0.9
grep -q 'the context window slid 5 times' "$SCRATCH/long.err" || { cat "$SCRATCH/long.err" >&2; fail "no slide"; }
grep -q 'step lengths 1 2 24)' "$SCRATCH/long.err" || { cat "$SCRATCH/long.err" >&2; fail "programs not cached by length"; }
[[ $(wc -c <"$SCRATCH/long") -eq 73 ]] || fail "expected 73 bytes, got $(wc -c <"$SCRATCH/long")"

# Several samples: one header each.
gen "$SCRATCH/n" --prompt "The" --max-new-tokens 10 --num-samples 3
[[ $(grep -c '^--- sample [123] ---$' "$SCRATCH/n") -eq 3 ]] || fail "expected 3 samples"
grep -q '30 tokens (3 samples)' "$SCRATCH/n.err" || fail "expected 30 tokens of 3 samples"

# bf16, and the run directory (its newest checkpoint) as the source.
gen "$SCRATCH/bf" --prompt "In the beginning" --max-new-tokens 20 --set precision.dtype=bf16
"$FLOWRUN" generate "$GPT" --checkpoint "$SCRATCH/gpt" "${MODEL[@]}" --prompt "In the beginning" \
  --max-new-tokens 16 --seed 1 >"$SCRATCH/dir" 2>/dev/null || fail "generate from the run directory failed"
cmp -s "$SCRATCH/a" "$SCRATCH/dir" || fail "the run directory's checkpoint gave other text"

# A safetensors export (Hugging Face names) gives the checkpoint's text.
expect_exit 0 "$FLOWRUN" export "$CK" --format safetensors --out "$SCRATCH/hf" --names hf
"$FLOWRUN" generate "$GPT" --checkpoint "$SCRATCH/hf/model.safetensors" "${MODEL[@]}" --prompt "In the beginning" \
  --max-new-tokens 16 --seed 1 >"$SCRATCH/st" 2>/dev/null || fail "generate from the safetensors export failed"
cmp -s "$SCRATCH/a" "$SCRATCH/st" || fail "the safetensors export gave other text"

# A sharded checkpoint (two data-parallel ranks, each writing its own file).
expect_exit 0 mpirun --allow-run-as-root --oversubscribe -np 2 "$FLOWRUN" train "$GPT" --run-dir "$SCRATCH/dp" \
  "${TINY[@]}" --set parallel.data=2 --set parallel.zero=1 --set train.sharded_checkpoints=true
SHARDS=$(ls -d "$SCRATCH/dp/checkpoints/"*.shards | tail -1)
"$FLOWRUN" generate "$GPT" --checkpoint "$SHARDS" "${MODEL[@]}" --prompt "In" --max-new-tokens 20 \
  --temperature 0 >"$SCRATCH/sh" 2>/dev/null || fail "generate from the sharded checkpoint failed"
[[ $(wc -c <"$SCRATCH/sh") -eq 23 ]] || fail "sharded: expected 23 bytes"

# Llama (rotary positions, grouped-query attention).
LLAMA="$SRC/configs/kjv_llama.yaml"
LTINY=(--set model.n_layer=1 --set model.n_head=4 --set model.n_kv_head=2 --set model.d_model=32 --set data.seq_len=32)
expect_exit 0 "$FLOWRUN" train "$LLAMA" --run-dir "$SCRATCH/llama" "${LTINY[@]}" --set train.batch_size=8 \
  --set train.steps=4 --set train.eval_every=0 --set data.eval_batches=2 --set schedule.warmup_steps=0 \
  --set train.checkpoint_every=0 --no-progress
expect_exit 0 "$FLOWRUN" generate "$LLAMA" --checkpoint "$SCRATCH/llama" "${LTINY[@]}" --prompt "In the" \
  --max-new-tokens 40
expect_log "40 tokens (1 sample)"

# Bad input: exit 2, naming what is wrong.
expect_exit 2 "$FLOWRUN" generate "$GPT" --checkpoint "$SCRATCH/nope.h5" "${MODEL[@]}"
expect_log "does not exist"
expect_exit 2 "$FLOWRUN" generate "$GPT" --checkpoint "$CK" "${MODEL[@]}" --top-p 1.5
expect_exit 2 "$FLOWRUN" generate "$GPT" --checkpoint "$CK" --set model.d_model=64 --set data.seq_len=32
expect_log "parameter"
expect_exit 2 "$FLOWRUN" generate "$SRC/configs/kjv_bert.yaml" --checkpoint "$CK"
expect_log "generat"
expect_exit 2 "$FLOWRUN" generate "$SRC/configs/fashion_cnn.yaml" --checkpoint "$CK"
expect_log "not text"
expect_exit 2 "$FLOWRUN" generat "$GPT"
expect_log "did you mean 'generate'"
echo "generate: same seed same text, greedy = top-k 1, slides past the context, bf16, sharded, run-directory and safetensors sources"

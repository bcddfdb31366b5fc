#!/usr/bin/env bash
# `flowrun export` to safetensors and the import behind --init-from / eval --checkpoint FILE.safetensors:
# the round trip is bit-identical under flowrun's and Hugging Face names, eval of an export scores as the
# checkpoint does, eval --dump writes the batches and a layer's output, and damaged, truncated or misfitting
# files are exit 2 naming the file and tensor.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
CFG="$SRC/tests/configs/tiny_gpt.yaml"
# One SGD step of lr 1e-45 on gradients clipped to 0.1: lr x g rounds to zero, the weights stay as imported.
SAME=(--set train.steps=1 --set optimizer.type=sgd --set optimizer.lr=1e-45 --set optimizer.weight_decay=0
  --set train.clip_grad_norm=0.1 --set schedule.type=constant --no-progress)
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/run" --set train.steps=3 --no-progress
CK="$SCRATCH/run/checkpoints/step_00000003.h5"

for names in flowrun hf; do
  expect_exit 0 "$FLOWRUN" export "$CK" --format safetensors --out "$SCRATCH/$names" --names "$names"
  expect_log "wrote $SCRATCH/$names/model.safetensors (28 tensors, $names names)"
  [[ -s "$SCRATCH/$names/config.json" ]] || fail "no config.json for $names names"
  expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/rt_$names" --init-from "$SCRATCH/$names/model.safetensors" "${SAME[@]}"
  expect_log "28 tensors imported ($names names)"
  if grep -q "warn" "$SCRATCH/last.log" && grep "warn" "$SCRATCH/last.log" | grep -q safetensors; then
    cat "$SCRATCH/last.log" >&2; fail "the import of a complete export warned"
  fi
  expect_exit 0 "$FLOWRUN" export "$SCRATCH/rt_$names/checkpoints/step_00000001.h5" --out "$SCRATCH/rt_${names}_out" --names "$names"
  cmp "$SCRATCH/$names/model.safetensors" "$SCRATCH/rt_${names}_out/model.safetensors" ||
    fail "export -> --init-from -> export differs ($names names)"
done
grep -q '"model_type": "gpt2"' "$SCRATCH/hf/config.json" || fail "hf config.json is not GPT-2's"
grep -q '"n_positions": 32' "$SCRATCH/hf/config.json" || fail "hf config.json: n_positions is not seq_len"
grep -q '"zoo": "gpt"' "$SCRATCH/flowrun/config.json" || fail "flowrun config.json lacks the resolved config"

# Evaluating the export scores as the checkpoint does; --dump writes x, logits and the named layer.
expect_exit 0 "$FLOWRUN" eval "$CFG" --checkpoint "$CK"
want=$(grep -o 'val_loss [^,]*' "$SCRATCH/last.log")
expect_exit 0 "$FLOWRUN" eval "$CFG" --checkpoint "$SCRATCH/hf/model.safetensors" --dump "$SCRATCH/d.h5" --layer ln_f
expect_log "$want"
h5ls -r "$SCRATCH/d.h5" >"$SCRATCH/h5ls.txt"
grep -q '^/x .*{16, 32}' "$SCRATCH/h5ls.txt" || { cat "$SCRATCH/h5ls.txt"; fail "dump: x is not the 2 eval batches"; }
grep -q '^/logits .*{16, 32, 256}' "$SCRATCH/h5ls.txt" || { cat "$SCRATCH/h5ls.txt"; fail "dump: logits"; }
grep -q '^/layer/ln_f .*{16, 32, 32}' "$SCRATCH/h5ls.txt" || { cat "$SCRATCH/h5ls.txt"; fail "dump: layer/ln_f"; }
expect_exit 2 "$FLOWRUN" eval "$CFG" --checkpoint "$CK" --dump "$SCRATCH/e.h5" --layer ln_g
expect_log "--layer: the model has no top-level layer 'ln_g'; its layers: blocks, dropout0, ln_f"
[[ ! -e "$SCRATCH/e.h5" ]] || fail "a refused dump left a file"

# Damaged and truncated files: exit 2, the file named, nothing trained.
ST="$SCRATCH/hf/model.safetensors"
bad() { cp "$ST" "$SCRATCH/bad.safetensors"; }
try_bad() {
  expect_exit 2 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/bad_run" --init-from "$SCRATCH/bad.safetensors" "${SAME[@]}"
  expect_log "safetensors file $SCRATCH/bad.safetensors"
  expect_log "$1"
}
head -c 5000 "$ST" >"$SCRATCH/bad.safetensors"
try_bad "run past the data"
head -c 6 "$ST" >"$SCRATCH/bad.safetensors"
try_bad "shorter than the 8-byte header length"
bad; printf '\xff\xff\xff\xff' | dd of="$SCRATCH/bad.safetensors" bs=1 seek=0 conv=notrunc status=none
try_bad "header length 4294967295 (bytes 0-7) exceeds the format's limit"
bad; printf 'x' | dd of="$SCRATCH/bad.safetensors" bs=1 seek=8 conv=notrunc status=none
try_bad "is not valid JSON at byte 8"
bad; at=$(LC_ALL=C grep -obUa -m1 '"F32"' "$SCRATCH/bad.safetensors" | head -1 | cut -d: -f1)
printf '"Q' | dd of="$SCRATCH/bad.safetensors" bs=1 seek="$at" conv=notrunc status=none
try_bad "unknown dtype 'Q32'"
# One byte more or less in the data than the header describes.
bad; printf '\0' >>"$SCRATCH/bad.safetensors"
try_bad "the header does not describe the data"
[[ ! -e "$SCRATCH/bad_run/checkpoints" ]] || [[ -z "$(ls "$SCRATCH/bad_run/checkpoints")" ]] || fail "a refused import trained"

# A model of other shapes: every misfitting tensor is named (exit 2); missing blocks too.
expect_exit 2 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/wide" --init-from "$ST" --set model.d_model=64 "${SAME[@]}"
expect_log "28 tensors do not fit the model (Hugging Face names"
expect_log "'transformer.wte.weight' (-> 'wte/w') is F32 [256,32] but the model's is [256,64]"
expect_log "'transformer.h.1.attn.c_attn.weight' (-> 'blocks.1/attn/qkv/w', transposed) is F32 [32,96] ([96,32] transposed) but the model's is [192,64]"
expect_exit 2 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/deep" --init-from "$ST" --set model.n_layer=3 "${SAME[@]}"
expect_log "12 tensors do not fit the model"
expect_log "'blocks.2/attn/qkv/w' [96,32] of the model is missing (its Hugging Face name: transformer.h.2.attn.c_attn.weight)"
# Tensors the model does not use are named in a warning; the rest imports.
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/shallow" --init-from "$ST" --set model.n_layer=1 "${SAME[@]}"
expect_log "12 tensors of the file the model does not use: transformer.h.1.attn.c_attn.bias"
expect_log "16 tensors imported (hf names)"

# Export refuses what it cannot name.
expect_exit 2 "$FLOWRUN" export "$SCRATCH/none.h5" --out "$SCRATCH/x"
expect_log "does not exist"
expect_exit 0 "$FLOWRUN" train "$SRC/tests/configs/tiny_mlp.yaml" --run-dir "$SCRATCH/mlp" --set train.steps=1 --no-progress
expect_exit 2 "$FLOWRUN" export "$SCRATCH/mlp/checkpoints/step_00000001.h5" --out "$SCRATCH/mlp_hf" --names hf
expect_log "--names hf: the checkpoint's model (mlp) has no Hugging Face name map"
expect_exit 0 "$FLOWRUN" export "$SCRATCH/mlp/checkpoints/step_00000001.h5" --out "$SCRATCH/mlp_flowrun"
echo "export/import round trips bit-identical under both names; damaged, truncated and misfitting files are exit 2"

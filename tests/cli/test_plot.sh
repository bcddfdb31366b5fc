#!/usr/bin/env bash
# scripts/plot_metrics draws a PNG from metrics.jsonl files (two runs overlaid) and rejects a bad file.
source "$(dirname "$0")/lib.sh"
SRC=$2
for run in a b; do
  mkdir -p "$SCRATCH/$run"
  for s in 1 2 3 4; do echo "{\"step\": $s, \"loss\": $((5 - s)).5, \"lr\": 0.1}"; done >"$SCRATCH/$run/metrics.jsonl"
  echo '{"step": 4, "split": "val", "val_loss": 1.7, "val_accuracy": 0.5}' >>"$SCRATCH/$run/metrics.jsonl"
done
expect_exit 0 "$SRC/scripts/plot_metrics" "$SCRATCH/a" "$SCRATCH/b/metrics.jsonl" -o "$SCRATCH/loss.png"
[[ "$(head -c 8 "$SCRATCH/loss.png" | od -An -tx1 | tr -d ' \n')" == 89504e470d0a1a0a ]] || fail "not a PNG"
echo 'not json' >>"$SCRATCH/a/metrics.jsonl"
expect_exit 1 "$SRC/scripts/plot_metrics" "$SCRATCH/a" -o "$SCRATCH/x.png"
expect_log "metrics.jsonl:6"
echo "plot ok"

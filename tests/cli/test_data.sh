#!/usr/bin/env bash
# `flowrun data`: Fashion-MNIST cut to its first N images of each split (--limit, the copy the GPU check
# carries), which trains; --limit is refused for the other datasets and must be positive.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
export FLOWRUN_DATA="$SCRATCH"
expect_exit 0 "$FLOWRUN" data fashion_mnist --limit 100
expect_log "wrote $SCRATCH/fashion_mnist.h5"
for split in train test; do
  h5ls "$SCRATCH/fashion_mnist.h5/$split/x" | grep -q '{100, 28, 28}' || fail "$split/x is not the first 100 images"
  h5ls "$SCRATCH/fashion_mnist.h5/$split/y" | grep -q '{100}' || fail "$split/y is not the first 100 labels"
done
expect_exit 0 "$FLOWRUN" train "$SRC/configs/fashion_cnn.yaml" --run-dir "$SCRATCH/run" --no-progress \
  --set train.steps=3 --set train.batch_size=16 --set train.eval_every=3 --set train.log_every=1 \
  --set schedule.warmup_steps=1
grep -q '"val_loss"' "$SCRATCH/run/metrics.jsonl" || fail "no evaluation on the cut copy"
expect_exit 2 "$FLOWRUN" data kjv --limit 10 --out "$SCRATCH/kjv.h5"
expect_log "--limit"
expect_exit 2 "$FLOWRUN" data fashion_mnist --limit 0 --out "$SCRATCH/x.h5"
echo "flowrun data --limit ok"

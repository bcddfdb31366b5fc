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

# Issue 16 row 13: without FLOWRUN_DATA, converted data goes to $XDG_CACHE_HOME/flowrun, else
# ~/.cache/flowrun, and never into the checkout (checked and trained from a copy of the source's configs).
unset FLOWRUN_DATA
mkdir -p "$SCRATCH/home"
(
  export HOME="$SCRATCH/home"
  unset XDG_CACHE_HOME
  expect_exit 0 "$FLOWRUN" data iris
  expect_log "wrote $SCRATCH/home/.cache/flowrun/iris.h5"
  export XDG_CACHE_HOME="$SCRATCH/xdg"
  expect_exit 0 "$FLOWRUN" check "$SRC/configs/quickstart.yaml" --set data.dataset=wine
  expect_log "$SCRATCH/xdg/flowrun/wine.h5"
  [[ -f "$SCRATCH/xdg/flowrun/wine.h5" ]] || fail "flowrun check did not convert wine into \$XDG_CACHE_HOME/flowrun"
)
[[ ! -e "$SRC/data/cache/iris.h5" && ! -e "$SRC/data/cache/wine.h5" ]] || fail "data was converted into the checkout"
echo "flowrun data --limit ok"

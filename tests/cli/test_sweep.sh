#!/usr/bin/env bash
# scripts/sweep --local: a 2 x 2 grid (command line and grid file) trains four points, each in its own
# directory, and --status tables them; an invalid point stops the sweep before anything runs.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
export FLOWRUN
BASE="$SRC/tests/configs/tiny_mlp.yaml"

expect_exit 0 "$SRC/scripts/sweep" "$BASE" --grid optimizer.lr=0.05,0.01 --grid train.steps=10,20 \
  --out "$SCRATCH/grid" --local
expect_log "sweep: 4 points"
[[ $(grep -c "| done |" "$SCRATCH/last.log") -eq 4 ]] || { cat "$SCRATCH/last.log" >&2; fail "not 4 finished points"; }
for i in 0 1 2 3; do [[ -s "$SCRATCH/grid/point_$i/metrics.jsonl" ]] || fail "point $i has no metrics"; done
grep -q "lr: 0.01" "$SCRATCH/grid/point_2/config.yaml" || fail "point 2 did not get optimizer.lr=0.01"
expect_exit 0 "$SRC/scripts/sweep" --status "$SCRATCH/grid"
expect_log "optimizer.lr=0.05 train.steps=20"
[[ $(grep -c "| done |" "$SCRATCH/last.log") -eq 4 ]] || fail "--status does not show 4 finished points"

printf 'optimizer.lr: [0.05, 0.02]  # two rates\nmodel.dropout: [0.0, 0.2]\n' >"$SCRATCH/grid.yaml"
expect_exit 0 "$SRC/scripts/sweep" "$BASE" --grid-file "$SCRATCH/grid.yaml" --grid train.steps=5 \
  --out "$SCRATCH/file" --local
[[ $(grep -c "| done |" "$SCRATCH/last.log") -eq 4 ]] || fail "grid file: not 4 finished points"

expect_exit 2 "$SRC/scripts/sweep" "$BASE" --grid optimizer.lr=0.05,fast --out "$SCRATCH/bad" --local
expect_log "optimizer.lr: expected a positive number"
expect_log "nothing was submitted"
[[ ! -e "$SCRATCH/bad/point_0/metrics.jsonl" ]] || fail "a point ran although the sweep was invalid"
echo "sweep: 4-point grids trained locally and summarised; an invalid point stopped the sweep"

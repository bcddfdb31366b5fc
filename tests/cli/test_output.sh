#!/usr/bin/env bash
# What lands in log files (issue 16 rows 14 and 15): no colour codes or progress redraws under mpirun (whose
# ranks get a pseudo-terminal even when its output goes to a file), no HDF5 error dump on a failed write but
# one line naming the file and the system's error, and a torchrun-style environment refused naming mpirun/srun.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
ESC=$'\033'

expect_exit 0 mpirun --allow-run-as-root --oversubscribe -np 1 "$FLOWRUN" train "$SRC/configs/quickstart.yaml" \
  --run-dir "$SCRATCH/run" --set train.steps=20 --set schedule.warmup_steps=5 --set train.log_every=5
expect_log "done: 20 steps"
! grep -q "$ESC" "$SCRATCH/last.log" || fail "escape codes in mpirun's captured output: $(grep -c "$ESC" "$SCRATCH/last.log") lines"
! grep -q $'\r' "$SCRATCH/last.log" || fail "progress redraws (carriage returns) in mpirun's captured output"

# A write that fails (RLIMIT_FSIZE: EFBIG, with SIGXFSZ ignored, stands for a full disk).
got=0
(trap '' XFSZ; ulimit -f 64; exec "$FLOWRUN" data kjv --out "$SCRATCH/kjv.h5") >"$SCRATCH/last.log" 2>&1 || got=$?
[[ $got -eq 1 ]] || { cat "$SCRATCH/last.log" >&2; fail "a failed HDF5 write exited $got, expected 1"; }
expect_log "$SCRATCH/kjv.h5"
expect_log "File too large"
! grep -q "HDF5-DIAG" "$SCRATCH/last.log" || fail "HDF5's own error stack was printed"
[[ $(wc -l <"$SCRATCH/last.log") -le 3 ]] || { cat "$SCRATCH/last.log" >&2; fail "more than 3 lines for one failed write"; }
[[ ! -e "$SCRATCH/kjv.h5" ]] || fail "a partial kjv.h5 was left"

# torchrun's variables are not a launch flowrun joins: exit 2 naming the launchers.
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
  expect_exit 2 "$FLOWRUN" train "$SRC/configs/quickstart.yaml" --run-dir "$SCRATCH/rank"
expect_log "mpirun -np 2"
expect_log "srun -n 2 --mpi=pmix"
echo "log output and launch errors ok"

#!/usr/bin/env bash
# A CPU run does not carry the GPU: flowrun and its core library link no CUDA library (the backend,
# libflowrun_cuda.so, is opened only when a run asks for cuda), a CPU run loads none, and with CUDA's
# libraries hidden (an empty folder mounted over /usr/local/cuda in a private mount namespace) the same binary
# trains, evaluates, times and passes the CPU unit tests, while asking for cuda is an exit-2 error naming the
# missing library. The quickstart's peak resident memory stays under 100 MB.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
BUILD=$(cd "$(dirname "$FLOWRUN")/.." && pwd)
CUDA_LIBS='libcudart|libcublas|libcudnn|libnccl|libcuda\.'

ldd "$FLOWRUN" "$BUILD/lib/libflowrun_core.so" >"$SCRATCH/ldd.txt"
! grep -E "$CUDA_LIBS" "$SCRATCH/ldd.txt" || fail "flowrun links a CUDA library"

# A CPU run loads no CUDA library (the dynamic loader's own record of every file it opens).
LD_DEBUG=files "$FLOWRUN" train "$SRC/configs/quickstart.yaml" --run-dir "$SCRATCH/quick" --no-progress \
  >"$SCRATCH/quick.log" 2>&1 || { tail -20 "$SCRATCH/quick.log" >&2; fail "the quickstart failed"; }
! grep -E "file=.*($CUDA_LIBS)" "$SCRATCH/quick.log" || fail "a CPU run loaded a CUDA library"
peak=$(grep -o 'peak resident [0-9.]* MiB' "$SCRATCH/quick.log" | awk '{print $3}')
awk -v p="$peak" 'BEGIN {exit !(p * 1048576 < 100e6)}' || fail "the quickstart peaked at $peak MiB, not under 100 MB"
echo "quickstart: no CUDA library loaded, peak resident $peak MiB"

# Where the CUDA toolkit is, hide it; without one there is nothing to hide (the checks above still hold).
if [[ -d /usr/local/cuda ]]; then
  mkdir -p "$SCRATCH/empty"
  HIDE=(unshare --mount sh -c 'mount --bind "$0" /usr/local/cuda && exec "$@"' "$SCRATCH/empty")
  "${HIDE[@]}" true || fail "cannot hide /usr/local/cuda (unshare --mount needs root)"
  "${HIDE[@]}" ls /usr/local/cuda >"$SCRATCH/hidden.txt"
  [[ ! -s "$SCRATCH/hidden.txt" ]] || fail "/usr/local/cuda is still visible"
else
  HIDE=()
fi
run_hidden() { expect_exit "$1" "${HIDE[@]}" "${@:2}"; }

run_hidden 0 "$FLOWRUN" version
run_hidden 0 "$FLOWRUN" train "$SRC/tests/configs/tiny_gpt.yaml" --run-dir "$SCRATCH/gpt" --no-progress \
  --set train.steps=4
expect_log "done: 4 steps"
run_hidden 0 "$FLOWRUN" eval "$SRC/tests/configs/tiny_gpt.yaml" --set data.eval_batches=2 \
  --checkpoint "$SCRATCH/gpt/checkpoints/step_00000004.h5"
run_hidden 0 "$FLOWRUN" time "$SRC/tests/configs/tiny_mlp.yaml" --steps 2 --warmup 1 --profile 1
run_hidden 2 "$FLOWRUN" train "$SRC/tests/configs/tiny_mlp.yaml" --run-dir "$SCRATCH/gpu" --set train.device=cuda
expect_log "train.device: 'cuda' is not available"
[[ ${#HIDE[@]} -eq 0 ]] || expect_log "libcudart"
# The CPU unit tests (the CUDA programs' compile tests need the backend).
run_hidden 0 "$BUILD/tests/flowrun_unit_tests" --gtest_filter='-CudaPrograms.*' --gtest_brief=1
expect_log "[  PASSED  ]"
echo "with CUDA's libraries hidden: version, train, eval, time, and the unit tests: $(grep -F '[  PASSED  ]' "$SCRATCH/last.log"); cuda refused"

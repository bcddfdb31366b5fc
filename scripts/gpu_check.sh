#!/usr/bin/env bash
# gpu_check.sh: the one GPU check (issue 8), sized for a 15-minute lease on one GPU. Runs the CUDA kernel
# tests (label gpu), the GPU-against-CPU training test (tests/cli/test_gpu_train.sh), trains
# configs/kjv_gpt.yaml on the GPU, then the GPT-2 124M bf16 benchmark, and writes every log and a summary
# under $OUT (or ./gpu-check-out). Exit status: 0 only if every step passed.
#
#   scripts/gpu_check.sh --pack     here (no GPU needed): build with CUDA and bundle the binaries, the shared
#                                   libraries they need beyond libc, and the data (KJV, wine, 2000
#                                   Fashion-MNIST images a split) into .gpu-pack/ (git-
#                                   ignored, about 40 MiB), for a machine that has a GPU but not the project's
#                                   Debian packages (the lent H200 reaches no package registry)
#   scripts/gpu_check.sh            on the GPU machine: uses .gpu-pack/ when it is there, else builds with CUDA
#                                   in build-gpu/ (needs the packages of scripts/setup.sh)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PACK_DIR="$ROOT/.gpu-pack"

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }

if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then usage; exit 0; fi

if [[ "${1:-}" == "--pack" ]]; then
  set -e
  # Not -march=native: the GPU machine's processor is another.
  # sm_90 only: the lent machine is an H200, and one architecture halves the nvcc time on 2 cores.
  scripts/setup.sh --build-dir build-gpu --target all -- -DFLOWRUN_CUDA=ON -DFLOWRUN_BENCH=OFF -DFLOWRUN_NATIVE=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib" "$stage/data"
  cp build-gpu/apps/flowrun build-gpu/tests/flowrun_gpu_tests "$stage/bin/"
  # flowrun's own libraries: the core, and the CUDA backend it opens beside it.
  cp build-gpu/lib/libflowrun_core.so build-gpu/lib/libflowrun_cuda.so "$stage/lib/"
  for d in kjv wine; do build-gpu/apps/flowrun data $d --out "$stage/data/$d.h5" >/dev/null; done
  # Fashion-MNIST whole is too big to carry (64 MiB a call): its first 2000 images of each split serve the
  # convnets of the GPU training test.
  build-gpu/apps/flowrun data fashion_mnist --limit 2000 --out "$stage/data/fashion_mnist.h5"
  # Every library the binaries load, but the C library's own and CUDA's (those must be the machine's: the
  # GPU machine has the CUDA 13 runtime and cuBLASLt, and cuDNN 9 and NCCL in its Python packages, which is
  # read off its package list, not yet seen loading: each would be hundreds of MiB to carry).
  for b in "$stage"/bin/* "$stage"/lib/libflowrun_*.so; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|libutil|libnsl|libanl|ld-linux[^/]*|libflowrun_[a-z]*)\.so' |
    grep -v '^/usr/local/cuda' | while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  # Only the new pack: the folder is carried whole, and the carry holds 64 MiB.
  rm -rf "$PACK_DIR" && mkdir -p "$PACK_DIR"
  tar -C "$stage" -czf "$PACK_DIR/pack.tar.gz" .
  rm -rf "$stage"
  grep -qx '/.gpu-pack/' .git/info/exclude 2>/dev/null || echo '/.gpu-pack/' >>.git/info/exclude
  echo "gpu_check.sh: $(du -h "$PACK_DIR/pack.tar.gz" | cut -f1) in $PACK_DIR/pack.tar.gz; carry .gpu-pack"
  exit 0
fi

OUT="${OUT:-$ROOT/gpu-check-out}"
mkdir -p "$OUT"
summary="$OUT/summary.md"
echo "# gpu_check $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null)" >"$summary"
status=0
step() {  # step NAME CMD...: runs CMD with its output in $OUT/NAME.log, one summary line
  local name=$1 start=$SECONDS rc
  shift
  "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "- $name: exit $rc in $((SECONDS - start)) s" >>"$summary"
  [[ $rc -eq 0 ]] || status=1
  return $rc
}

{ nvidia-smi -L && nvidia-smi --query-gpu=driver_version,memory.total,clocks.max.sm --format=csv,noheader; } \
  >>"$summary" 2>&1 || echo "- nvidia-smi: failed (no driver?)" >>"$summary"
if [[ -f "$PACK_DIR/pack.tar.gz" ]]; then
  BIN=/tmp/flowrun-gpu
  rm -rf "$BIN" && mkdir -p "$BIN" && tar -C "$BIN" -xzf "$PACK_DIR/pack.tar.gz"
  # CUDA's libraries from the machine: its toolkit, else a Python package's copy (nvidia-cublas), wherever
  # the image keeps them (the likely places first, then the whole file system).
  cuda_libs=/usr/local/cuda/lib64
  for lib in libcublasLt.so.13 libcudart.so.13 libnccl.so.2 libcudnn.so.9; do
    found=$(find /usr/local/cuda/lib64 /usr/local/lib /usr/lib /opt -name "$lib*" 2>/dev/null | head -1)
    [[ -n "$found" ]] || found=$(find / -xdev -name "$lib*" 2>/dev/null | head -1)
    [[ -n "$found" ]] && cuda_libs="$cuda_libs:$(dirname "$found")"
  done
  # The machine's C++ runtime where it is at least the pack's: CUDA's libraries there (cuDNN) may need its
  # newer symbols, and a newer libstdc++ serves the pack's binaries too.
  newest() { grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$1" | sort -uV | tail -1; }
  system_cxx=$(ldconfig -p | awk '$1 == "libstdc++.so.6" && $NF ~ /^\// {print $NF; exit}')
  if [[ -n "$system_cxx" ]]; then
    theirs=$(newest "$system_cxx")
    if [[ $(printf '%s\n' "$(newest "$BIN/lib/libstdc++.so.6")" "$theirs" | sort -V | tail -1) == "$theirs" ]]; then
      rm -f "$BIN/lib/libstdc++.so.6" "$BIN/lib/libgcc_s.so.1"
    fi
  fi
  export LD_LIBRARY_PATH="$BIN/lib:$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export FLOWRUN_DATA="$BIN/data" FLOWRUN_MODELS="$ROOT/models"  # not the build machine's paths
  FLOWRUN="$BIN/bin/flowrun" GPU_TESTS="$BIN/bin/flowrun_gpu_tests" BACKEND="$BIN/lib/libflowrun_cuda.so"
else
  step build scripts/setup.sh --build-dir build-gpu --target all -- -DFLOWRUN_CUDA=ON -DFLOWRUN_BENCH=OFF || {
    echo "gpu_check.sh: the CUDA build failed (see $OUT/build.log)" >&2
    exit 1
  }
  FLOWRUN=build-gpu/apps/flowrun GPU_TESTS=build-gpu/tests/flowrun_gpu_tests BACKEND=build-gpu/lib/libflowrun_cuda.so
fi

# Every library found (a missing one is the first thing to fix on a new machine).
if ldd "$FLOWRUN" "$GPU_TESTS" "$BACKEND" | grep 'not found' >"$OUT/missing.txt"; then
  echo "- libraries: missing" >>"$summary" && sed 's/^/  /' "$OUT/missing.txt" >>"$summary" && status=1
fi
rm -f "$OUT/missing.txt"
# Each step has a time limit, so that one that hangs leaves the others their turn inside the lease; the
# device tool returns at most 8 files, so the logs are few: the summary, one log per step, kjv's metrics.
step gpu_tests timeout 120 "$GPU_TESTS"
grep -E '^\[  (PASSED|FAILED)  \] ([0-9]+ tests?|.*ms\)$)' "$OUT/gpu_tests.log" | sed 's/^/  /' >>"$summary"
step gpu_train timeout -k 5 150 tests/cli/test_gpu_train.sh "$FLOWRUN" "$ROOT"
grep -E '^(mlp|cnn|resnet|gpt|FAIL)' "$OUT/gpu_train.log" | sed 's/^/  /' >>"$summary"
# NCCL between GPUs: only where there are two of them (and mpirun).
if [[ $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') -ge 2 ]] && command -v mpirun >/dev/null; then
  step gpu_dist timeout 240 tests/cli/test_gpu_dist.sh "$FLOWRUN" "$ROOT"
  tail -2 "$OUT/gpu_dist.log" | sed 's/^/  /' >>"$summary"
else
  echo "- gpu_dist: skipped (NCCL needs two GPUs and mpirun)" >>"$summary"
fi
# The whole KJV run (800 steps): its validation loss goes into the summary, to hold against the CPU's
# (README, "Results").
run=$(mktemp -d)
step train_kjv_gpt timeout 60 "$FLOWRUN" train configs/kjv_gpt.yaml --set train.device=cuda --run-dir "$run" \
  --no-progress
cp "$run/metrics.jsonl" "$OUT/kjv_gpt_metrics.jsonl" 2>/dev/null
grep '"val_loss"' "$run/metrics.jsonl" | tail -1 | sed 's/^/  /' >>"$summary"
rm -rf "$run"
# GPT-2 124M in bf16, with CUDA graphs (the default) and without.
for graph in true false; do
  step "bench_gpt2_124m_graph_$graph" timeout 45 "$FLOWRUN" time configs/bench/gpt2_124m.yaml \
    --set train.device=cuda --set train.cuda_graph=$graph --steps 20 --warmup 5 --profile 3 --json
  grep -E '^(step|memory):' "$OUT/bench_gpt2_124m_graph_$graph.log" | sed 's/^/  /' >>"$summary"
done
cat "$summary"
exit $status

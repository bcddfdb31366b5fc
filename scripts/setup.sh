#!/usr/bin/env bash
# setup.sh: install flowrun's Debian build/test dependencies (idempotently), then configure and build with CMake.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/setup.sh [options] [-- extra cmake args...]

Options:
  --deps-only        Install missing Debian packages only; do not configure or build.
  --build-dir DIR    Build directory (default: build).
  --type TYPE        CMake build type: Release | Debug | RelWithDebInfo (default: Release).
  --jobs N           Parallel build jobs (default: nproc).
  --target T         What to build (default: flowrun, the command-line tool; 'all' adds the tests and
                     benchmarks, as scripts/test.sh does).
  --help             Show this help and exit.

Arguments after "--" are passed to the CMake configure step unchanged.
USAGE
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DEPS_ONLY=0
BUILD_DIR=build
BUILD_TYPE=Release
JOBS="$(nproc)"
TARGET=flowrun
EXTRA_CMAKE_ARGS=()

need_value() { [[ $# -ge 2 && -n "$2" ]] || { echo "error: $1 requires a value" >&2; exit 2; }; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --deps-only) DEPS_ONLY=1; shift ;;
    --build-dir) need_value "$@"; BUILD_DIR="$2"; shift 2 ;;
    --type) need_value "$@"; BUILD_TYPE="$2"; shift 2 ;;
    --jobs) need_value "$@"; JOBS="$2"; shift 2 ;;
    --target) need_value "$@"; TARGET="$2"; shift 2 ;;
    --help|-h) usage; exit 0 ;;
    --) shift; EXTRA_CMAKE_ARGS=("$@"); break ;;
    *) echo "error: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done

case "$BUILD_TYPE" in
  Release|Debug|RelWithDebInfo) ;;
  *) echo "error: --type must be Release, Debug or RelWithDebInfo (got '$BUILD_TYPE')" >&2; exit 2 ;;
esac
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || { echo "error: --jobs must be a positive integer (got '$JOBS')" >&2; exit 2; }

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libdnnl-dev libopenblas-openmp-dev libyaml-cpp-dev libhdf5-dev libcli11-dev libspdlog-dev
  nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  openmpi-bin libopenmpi-dev slurmctld slurmd slurm-client munge
  opencl-headers ocl-icd-opencl-dev debootstrap jq python3-venv
  zlib1g-dev python3-sklearn python3-matplotlib dataset-fashion-mnist bible-kjv hdf5-tools
)

MISSING=()
for pkg in "${PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || MISSING+=("$pkg")
done

if [[ ${#MISSING[@]} -gt 0 ]]; then
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "error: missing Debian packages: ${MISSING[*]}" >&2
    echo "Install them as root, e.g.:" >&2
    echo "  sudo apt-get install -y --no-install-recommends ${MISSING[*]}" >&2
    exit 2
  fi
  echo "Installing missing packages: ${MISSING[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${MISSING[@]}"
fi

[[ "$DEPS_ONLY" -eq 1 ]] && exit 0

CMAKE_ARGS=(-S . -B "$BUILD_DIR" "-DCMAKE_BUILD_TYPE=$BUILD_TYPE")
# Pick Ninja only for a fresh build dir; an existing cache keeps its generator.
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
  CMAKE_ARGS+=(-G Ninja)
fi
command -v ccache >/dev/null 2>&1 && CMAKE_ARGS+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

cmake "${CMAKE_ARGS[@]}" "${EXTRA_CMAKE_ARGS[@]}"
cmake --build "$BUILD_DIR" -j "$JOBS" --target "$TARGET"

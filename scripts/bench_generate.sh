#!/usr/bin/env bash
# bench_generate.sh: the decode step's time per token at a short and a long prefix (flat with the key/value
# cache), beside the prefill of the long prefix (what each token would cost without the cache), alternating
# the two prefixes; medians over the repeats, from `flowrun generate`'s summary line.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/bench_generate.sh --checkpoint CKPT [--config FILE] [--short N] [--long N] [--tokens N]
                                 [--repeat N] [--build-dir DIR] [-- extra generate args...]

  --checkpoint CKPT  Checkpoint (or run directory) of the config's model (required)
  --config FILE      Config (default: configs/kjv_gpt.yaml)
  --short N          Short prefix in tokens (default 16)
  --long N           Long prefix (default 120; with --tokens, at most the context)
  --tokens N         New tokens per run (default 8: 120 + 8 fill a context of 128)
  --repeat N         Runs per prefix, alternating (default 9)
  --build-dir DIR    Where flowrun is built (default: build)
USAGE
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CONFIG=configs/kjv_gpt.yaml CKPT="" SHORT=16 LONG=120 TOKENS=8 REPEAT=9 BUILD_DIR=build EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --checkpoint) CKPT=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --short) SHORT=$2; shift 2 ;;
    --long) LONG=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --help|-h) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$CKPT" ]] || { echo "error: --checkpoint is required (see --help)" >&2; exit 2; }
FLOWRUN="$BUILD_DIR/apps/flowrun"
[[ -x "$FLOWRUN" ]] || scripts/setup.sh --build-dir "$BUILD_DIR"
OUT="$(mktemp -d "${TMPDIR:-/tmp}/flowrun-bench-gen.XXXXXX")"
trap 'rm -rf "$OUT"' EXIT

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# A prompt of n bytes (byte-level models): the start of Genesis, repeated.
prompt() { yes 'In the beginning God created the heaven and the earth. ' | head -c 100000 | tr -d '\n' | head -c "$1"; }

for ((r = 0; r < REPEAT; ++r)); do
  for n in "$SHORT" "$LONG"; do
    "$FLOWRUN" generate "$CONFIG" --checkpoint "$CKPT" --prompt "$(prompt "$n")" --max-new-tokens "$TOKENS" \
      --temperature 0 "${EXTRA[@]}" 2>&1 >/dev/null | tail -1 >>"$OUT/$n.log"
  done
done
stat() { grep -o "$2 [0-9.]*" "$OUT/$1.log" | awk '{print $NF}' | median; }
printf '%-8s %16s %16s\n' prefix "decode ms/token" "prefill ms"
for n in "$SHORT" "$LONG"; do
  printf '%-8s %16s %16s\n' "$n" "$(stat "$n" 'decode')" "$(stat "$n" 'prefilled in')"
done
echo "(medians of $REPEAT runs each, $TOKENS new tokens per run; $CONFIG, $CKPT)"

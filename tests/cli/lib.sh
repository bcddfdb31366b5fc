# Shared helpers for the CLI integration tests: a scratch directory removed on exit, and assertions.
set -euo pipefail
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/flowrun-cli.XXXXXX")"
trap 'rm -rf "$SCRATCH"' EXIT
# Each test's mpiruns keep their session directories in its scratch directory. OpenMPI 4 puts every run's under
# one /tmp/ompi.HOST.UID, which a finishing run removes once it is empty; a run of a concurrent test that was
# starting meanwhile could not create its own there (orte_session_dir, cli.output, once in CI on 2026-12-06).
export OMPI_MCA_orte_tmpdir_base="$SCRATCH"

fail() { echo "FAIL: $*" >&2; exit 1; }

# torch_python SRC MODULE...: sets PY to $FLOWRUN_TORCH_PYTHON, else SRC's bench venv, when it imports every
# MODULE; otherwise skips the test (exit 77), for the Python data checks (scripts/check_*.py).
torch_python() {
  local src=$1; shift
  PY=${FLOWRUN_TORCH_PYTHON:-$src/.venv-bench/bin/python}
  if ! [[ -x "$PY" ]] || ! "$PY" -c "import $(IFS=,; echo "$*")" 2>/dev/null; then
    echo "skipped: no Python with $* (set FLOWRUN_TORCH_PYTHON)"
    exit 77
  fi
}

# expect_exit CODE CMD...: runs CMD, capturing stdout+stderr in $SCRATCH/last.log; fails unless it exits CODE.
expect_exit() {
  local want=$1; shift
  local got=0
  "$@" >"$SCRATCH/last.log" 2>&1 || got=$?
  [[ "$got" -eq "$want" ]] || { cat "$SCRATCH/last.log" >&2; fail "exit code $got, expected $want: $*"; }
}

# expect_log TEXT: the last command's output contains TEXT.
expect_log() {
  grep -qF -- "$1" "$SCRATCH/last.log" || { cat "$SCRATCH/last.log" >&2; fail "output lacks '$1'"; }
}

# The per-step training records of a metrics.jsonl without wall-clock fields (rates, time) and without the
# checkpoint records (paths and timings).
losses() { grep -v '"checkpoint"' "$1" | sed -E 's/, "(tokens_per_s|samples_per_s|threads|time)": [^,}]*//g'; }

# wait_logged METRICS N: until a running trainer has logged N steps to METRICS (at most 30 s).
wait_logged() {
  for _ in $(seq 600); do
    [[ $(grep -c '"loss"' "$1" 2>/dev/null || true) -ge $2 ]] && return 0
    sleep 0.05
  done
  fail "$1 did not reach $2 logged steps in 30 s"
}

# max_rel A B: largest |a - b| / |a| over the per-step losses of two metrics files (which must have as many).
max_rel() {
  paste <(grep -o '"loss": [0-9.e+-]*' "$1" | awk '{print $2}') <(grep -o '"loss": [0-9.e+-]*' "$2" | awk '{print $2}') |
    awk 'NF != 2 {bad = 1} {d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d} END {if (bad || NR == 0) print "mismatch"; else printf "%.3g\n", m}'
}
# within X T: X (a max_rel) is at most T.
within() { awk -v x="$1" -v t="$2" 'BEGIN {exit !(x != "mismatch" && x + 0 <= t)}'; }

# check_case name config loose layout extra-args...: trains CONFIG in one process and under LAYOUT with
# mpirun; the per-step losses must agree within 1e-5 relative and the final checkpoints within 1e-5 (uses
# $FLOWRUN and the caller's COMMON arguments). layout: ranks:data:tensor[:pipeline]; loose: a regex of
# tensors allowed to differ up to 1e-3, or "". A pipeline runs 4 micro-batches, so its case's extra
# arguments give the one-process run as many. NOISE (a regex, unset: none) names tensors whose exact gradient
# is zero (BERT's attention key bias: softmax ignores a shift shared by all keys), which hold rounding noise
# (1e-13) with no scale to be relative to: they are held to |a - b| <= 1e-9 (h5diff) instead (not combined
# with `loose`, whose 1e-3 check covers every tensor).
check_case() {
  local name=$1 cfg=$2 loose=$3 layout=$4; shift 4
  local n d t p
  IFS=: read -r n d t p <<<"$layout"
  p=${p:-1}
  [[ -d "$SCRATCH/$name-1" ]] || expect_exit 0 "$FLOWRUN" train "$cfg" --run-dir "$SCRATCH/$name-1" "${COMMON[@]}" "$@"
  local run="$SCRATCH/$name-d${d}t${t}p$p" stages=()
  ((p > 1)) && stages=(--set parallel.pipeline="$p" --set parallel.micro_batches=4)
  expect_exit 0 mpirun --allow-run-as-root --oversubscribe -np "$n" "$FLOWRUN" train "$cfg" --run-dir "$run" \
    "${COMMON[@]}" --set parallel.data="$d" --set parallel.tensor="$t" "${stages[@]}" "$@"
  local rel
  rel=$(max_rel "$SCRATCH/$name-1/metrics.jsonl" "$run/metrics.jsonl")
  within "$rel" 1e-5 || fail "$name: data $d x tensor $t x pipeline $p losses differ from one process by $rel"
  local a b
  a=$(ls "$SCRATCH/$name-1/checkpoints/"*.h5 | tail -1) b=$(ls "$run/checkpoints/"*.h5 | tail -1)
  if ! "$FLOWRUN" inspect "$a" --diff "$b" --rtol 1e-5 >"$SCRATCH/diff.log" 2>&1; then
    local noise=${NOISE:-^$} tensor noisy
    noisy=$(grep ': max |a - b|' "$SCRATCH/diff.log" | cut -d: -f1 | grep -E "$noise" || true)
    for tensor in $noisy; do
      # (Its checksum attribute differs with its bits.)
      h5diff -d 1e-9 --exclude-attribute "/$tensor" "$a" "$b" "/$tensor" "/$tensor" >/dev/null ||
        fail "$name: data $d x tensor $t x pipeline $p: $tensor (rounding noise) differs by more than 1e-9"
    done
    if grep ': max |a - b|' "$SCRATCH/diff.log" | grep -vqE "$noise"; then
      # Only the tensors named by `loose` may differ beyond 1e-5 (see below), and by less than 1e-3.
      [[ -n "$loose" ]] && ! grep ': max |a - b|' "$SCRATCH/diff.log" | grep -vE "$noise" | grep -vE "$loose" ||
        { cat "$SCRATCH/diff.log" >&2; fail "$name: data $d x tensor $t x pipeline $p weights differ beyond 1e-5"; }
      expect_exit 0 "$FLOWRUN" inspect "$a" --diff "$b" --rtol 1e-3
    else
      echo "within 1e-5 but for rounding noise within 1e-9:" $noisy >>"$SCRATCH/diff.log"
    fi
  fi
  echo "$name: data $d x tensor $t x pipeline $p losses within $rel of one process; weights: $(tail -1 "$SCRATCH/diff.log")"
  [[ -f "$run/rank_$((n - 1)).log" ]] || fail "$name: rank $((n - 1)) kept no log"
}

# tracks_fp32 NAME PREFIX: the runs PREFIX-bf16 and PREFIX-fp16 end within 2% of PREFIX-fp32 (the mean
# loss of the last 50 logged steps of each).
tail_mean() { grep -o '"loss": [0-9.e+-]*' "$1" | tail -50 | awk '{s += $2} END {printf "%.6f", s / NR}'; }
tracks_fp32() {
  local ref got dtype
  ref=$(tail_mean "$2-fp32/metrics.jsonl")
  for dtype in bf16 fp16; do
    got=$(tail_mean "$2-$dtype/metrics.jsonl")
    awk -v a="$got" -v b="$ref" 'BEGIN {d = (a - b) / b; if (d < 0) d = -d; exit !(d <= 0.02)}' ||
      fail "$1 $dtype: mean loss of the last 50 steps $got is not within 2% of fp32's $ref"
    echo "$1 $dtype: last-50 mean loss $got vs fp32 $ref"
  done
}

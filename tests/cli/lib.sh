# Shared helpers for the CLI integration tests: a scratch directory removed on exit, and assertions.
set -euo pipefail
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/flowrun-cli.XXXXXX")"
trap 'rm -rf "$SCRATCH"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

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
losses() { grep -v '"checkpoint"' "$1" | sed -E 's/, "(tokens_per_s|samples_per_s|time)": [^,}]*//g'; }

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

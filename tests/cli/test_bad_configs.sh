#!/usr/bin/env bash
# The malformed-config corpus through the CLI: `flowrun check` must exit 2 with every `# expect:` text of
# each file (which include the key path and the line) and never crash; `# set:` lines become --set options.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
n=0
for f in "$SRC"/tests/configs/bad/*.yaml; do
  args=()
  while IFS= read -r kv; do args+=(--set "$kv"); done < <(sed -n 's/^# set: //p' "$f")
  expect_exit 2 "$FLOWRUN" check "$f" "${args[@]}"
  while IFS= read -r want; do expect_log "$want"; done < <(sed -n 's/^# expect: //p' "$f")
  n=$((n + 1))
done
[[ $n -ge 30 ]] || fail "only $n malformed configs in the corpus"
echo "$n malformed configs rejected with exit code 2 and their location"

# A device this build or machine cannot use: refused before anything runs, naming the key (here: no GPU, so
# "no CUDA device is visible" in a CUDA build, "no CUDA backend" otherwise).
expect_exit 2 "$FLOWRUN" train "$SRC/configs/quickstart.yaml" --set train.device=cuda
expect_log "train.device: 'cuda'"
expect_log "use cpu"
echo "train.device=cuda refused: $(grep -o "train.device: 'cuda'.*" "$SCRATCH/last.log")"

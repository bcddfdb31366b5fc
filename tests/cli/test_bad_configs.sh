#!/usr/bin/env bash
# The malformed-config corpus through the CLI: `flowrun check` must exit 2 with every `# expect:` text of
# each file (which include the key path and the line) and never crash; `# set:` lines become --set options.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
# The cases whose error is in the model are built on the iris table, prepared (small and fast) here.
export FLOWRUN_DATA="$SCRATCH/data"
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

# A config is a regular file of at most 1 MiB: devices are refused at once, not read until memory runs out.
for dev in /dev/zero /dev/urandom; do
  expect_exit 2 timeout 20 "$FLOWRUN" check "$dev"
  expect_log "$dev: cannot read the config file: not a regular file"
done
{ printf 'model:\n  zoo: mlp\n# '; head -c $((1 << 20)) /dev/zero | tr '\0' x; echo; } >"$SCRATCH/big.yaml"
expect_exit 2 "$FLOWRUN" check "$SCRATCH/big.yaml"
expect_log "big.yaml: cannot read the config file: larger than 1 MiB"
# A long value is cut in the message, not echoed whole (from a file, and from --set).
long=$(head -c 500000 /dev/zero | tr '\0' y)
printf 'model:\n  zoo: mlp\noptimizer:\n  type: %s\n' "$long" >"$SCRATCH/long.yaml"
expect_exit 2 "$FLOWRUN" check "$SCRATCH/long.yaml"
expect_log 'optimizer.type: expected one of sgd, adam, adamw, got "yyyyyyyyyyyyyyyyyyyy'
expect_log 'yyy..."'
[[ $(wc -c <"$SCRATCH/last.log") -lt 1000 ]] || fail "the long value was echoed: $(wc -c <"$SCRATCH/last.log") bytes"
expect_exit 2 "$FLOWRUN" check "$SRC/configs/quickstart.yaml" --set "optimizer.lr=${long:0:100000}"
[[ $(wc -c <"$SCRATCH/last.log") -lt 1000 ]] || fail "the long --set value was echoed"
echo "devices, files over 1 MiB and long values: refused, messages cut"

# A run shorter than its warmup is not bad: the warmup is capped at the run's length, with a warning, and
# the resolved config shows the capped value; the shortened run trains.
CFG=(--set data.dataset=iris --set train.batch_size=8)
expect_exit 0 "$FLOWRUN" check "$SRC/configs/quickstart.yaml" "${CFG[@]}" --set train.steps=10
expect_log "flowrun: warning: $SRC/configs/quickstart.yaml:"
expect_log "schedule.warmup_steps: 100 is longer than the run: capped to train.steps 10"
expect_log "warmup_steps: 10"
expect_exit 0 "$FLOWRUN" check "$SRC/tests/configs/good/warmup_longer_than_run.yaml" --set data.dataset=iris
expect_log "schedule.warmup_steps: 2000 is longer than the run: capped to train.steps 1000"
expect_exit 0 "$FLOWRUN" train "$SRC/configs/quickstart.yaml" "${CFG[@]}" --set train.steps=3 \
  --set train.eval_every=0 --set train.checkpoint_every=0 --run-dir "$SCRATCH/short" --no-progress
expect_log "capped to train.steps 3"
[[ -f "$SCRATCH/short/checkpoints/step_00000003.h5" ]] || fail "the shortened run did not finish"
echo "a warmup longer than the run: capped with a warning, and the run trains"

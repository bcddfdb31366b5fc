#!/usr/bin/env bash
# flowrun train --dump-step: the file holds the step's batch, loss, every parameter and its gradient; the
# gradient is the one the update used (plain SGD: the checkpoint after the step is before - lr * grad), also
# where a compiled step would not make it (SGD with momentum);
# under accumulation the batch is the whole step's and the loss the micro-batches' mean; and the cases it
# cannot record (several processes, fp16, --detect-anomaly, no step left, no such directory) exit 2 before
# training, leaving no file.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
MLP=("$SRC/tests/configs/tiny_mlp.yaml" --set train.steps=1 --set model.dropout=0.0 --set optimizer.momentum=0.0
  --set optimizer.nesterov=false --set train.eval_every=0 --no-progress)

# values FILE DATASET: its elements, one per line, at full f32/f64 precision (the first DATA block: a
# checkpoint's datasets have a crc32c attribute after it).
values() {
  h5dump -m '%.17g' -y -w 0 -d "$2" "$1" | awk '/DATA \{/ && !done {on = 1; next} on && /^ *\}/ {on = 0; done = 1} on' |
    tr ',' '\n' | awk 'NF {print $1}'
}
attr() { h5dump -m '%.17g' -a "$2" "$1" | awk '/\(0\):/ {sub(/.*\(0\): */, ""); print; exit}'; }

DUMP="$SCRATCH/mlp.h5"
expect_exit 0 "$FLOWRUN" train "${MLP[@]}" --run-dir "$SCRATCH/mlp" --dump-step "$DUMP"
expect_log "--dump-step: wrote step 1 to $DUMP"
[[ -f "$DUMP" ]] || fail "no dump written"
ls "$SCRATCH" | grep -q '\.tmp\.' && fail "a temporary file was left behind"
h5ls -r "$DUMP" | tr -s ' ' >"$SCRATCH/list"
for want in "/x Dataset {64, 1, 28, 28}" "/y Dataset {64}" "/micro_loss Dataset {1}" \
  "/params/hidden.0/fc/w Dataset {64, 784}" "/grads/hidden.0/fc/w Dataset {64, 784}" \
  "/params/head/b Dataset {10}" "/grads/head/b Dataset {10}"; do
  grep -qxF "$want" "$SCRATCH/list" || { cat "$SCRATCH/list" >&2; fail "the dump lacks $want"; }
done
# Every parameter has its gradient, of its shape.
diff <(grep '^/params/.* Dataset' "$SCRATCH/list" | sed 's|^/params/||') \
  <(grep '^/grads/.*Dataset' "$SCRATCH/list" | sed 's|^/grads/||') || fail "parameters and gradients differ"
[[ $(attr "$DUMP" format) == '"flowrun-step-dump"' ]] || fail "format attribute: $(attr "$DUMP" format)"
[[ $(attr "$DUMP" step) == 1 ]] || fail "step attribute: $(attr "$DUMP" step)"
[[ $(attr "$DUMP" lr) == 0.050000000000000003 ]] || fail "lr attribute: $(attr "$DUMP" lr)"
# The loss is the one the trainer logged (metrics.jsonl has 6 significant digits or more).
logged=$(grep -o '"loss": [0-9.e+-]*' "$SCRATCH/mlp/metrics.jsonl" | head -1 | awk '{print $2}')
awk -v a="$(attr "$DUMP" loss)" -v b="$logged" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b)}' ||
  fail "dumped loss $(attr "$DUMP" loss), logged $logged"
# Plain SGD: the weights after the step are exactly before - lr * grad, rounded to f32 (a gradient other
# than the one the update read would be far off).
CK="$SCRATCH/mlp/checkpoints/step_00000001.h5"
for p in head/w head/b hidden.0/fc/w hidden.0/fc/b; do
  paste <(values "$DUMP" "/params/$p") <(values "$DUMP" "/grads/$p") <(values "$CK" "/params/$p") |
    awk -v p="$p" '{ want = $1 - 0.05 * $2; d = $3 - want; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1;
                     if (s > scale) scale = s; if (d > worst) worst = d; if ($2 != 0) moved = 1; n++ }
                   END { if (n == 0 || !moved || worst > 1e-6 * scale) { print p ": " n " values, worst " worst; exit 1 } }' ||
    fail "the step did not apply the dumped gradient to $p"
done

# SGD with momentum, whose weight gradients a compiled step computes into the momentum buffers
# (fuse_momentum_products): the dump still holds every parameter's gradient.
expect_exit 0 "$FLOWRUN" train "${MLP[@]}" --set optimizer.momentum=0.9 --run-dir "$SCRATCH/mlp-momentum" \
  --dump-step "$SCRATCH/momentum.h5"
h5ls -r "$SCRATCH/momentum.h5" | tr -s ' ' >"$SCRATCH/list"
grep -qxF "/grads/hidden.0/fc/w Dataset {64, 784}" "$SCRATCH/list" || fail "the momentum dump lacks a gradient"
diff <(grep '^/params/.* Dataset' "$SCRATCH/list" | sed 's|^/params/||') \
  <(grep '^/grads/.*Dataset' "$SCRATCH/list" | sed 's|^/grads/||') || fail "momentum: parameters and gradients differ"

# Accumulation (the tiny GPT, 2 micro-batches of 4): the step's 8 rows, 2 losses whose mean is the loss.
GPT=("$SRC/tests/configs/tiny_gpt.yaml" --set train.steps=1 --set model.dropout=0.0 --set train.micro_batch_size=4
  --set train.eval_every=0 --no-progress)
expect_exit 0 "$FLOWRUN" train "${GPT[@]}" --run-dir "$SCRATCH/gpt" --dump-step "$SCRATCH/gpt.h5"
h5ls -r "$SCRATCH/gpt.h5" | tr -s ' ' >"$SCRATCH/list"
for want in "/x Dataset {8, 32}" "/y Dataset {8, 32}" "/micro_loss Dataset {2}" "/grads/wte/w Dataset {256, 32}" \
  "/grads/blocks.1/attn/qkv/w Dataset {96, 32}" "/state/opt/wte/w/m Dataset {256, 32}"; do
  grep -qxF "$want" "$SCRATCH/list" || { cat "$SCRATCH/list" >&2; fail "the accumulated dump lacks $want"; }
done
grep -q grad_acc "$SCRATCH/list" && fail "the gradient accumulators were dumped as state"
[[ $(attr "$SCRATCH/gpt.h5" grad_accumulation) == 2 ]] || fail "grad_accumulation attribute"
values "$SCRATCH/gpt.h5" /micro_loss | awk -v l="$(attr "$SCRATCH/gpt.h5" loss)" \
  '{s += $1; n++} END {d = s / n - l; if (d < 0) d = -d; exit !(n == 2 && d <= 1e-12 * l)}' ||
  fail "the loss is not the mean of the micro-batches' losses"

# BERT (the tiny GPT's sizes, 2 micro-batches): the masked ids the model read and the labels its loss used,
# the step's 8 rows each; some positions are scored, each with its original byte as the label, some of them
# read as [MASK] (256), and the unscored ones read unchanged.
expect_exit 0 "$FLOWRUN" train "${GPT[@]}" --set model.zoo=bert --run-dir "$SCRATCH/bert" --dump-step "$SCRATCH/bert.h5"
h5ls -r "$SCRATCH/bert.h5" | tr -s ' ' >"$SCRATCH/list"
ids=$(grep -o '^/mlm/.*/ids Dataset {8, 32}$' "$SCRATCH/list" | cut -d' ' -f1)
labels=$(grep -o '^/mlm/.*/labels Dataset {8, 32}$' "$SCRATCH/list" | cut -d' ' -f1)
[[ $(wc -w <<<"$ids") == 1 && $(wc -w <<<"$labels") == 1 ]] || { cat "$SCRATCH/list" >&2; fail "no single masked ids and labels"; }
paste <(values "$SCRATCH/bert.h5" /x) <(values "$SCRATCH/bert.h5" "$labels") <(values "$SCRATCH/bert.h5" "$ids") |
  awk '$2 != -100 {n++; if ($2 != $1) bad++; if ($3 == 256) masked++}
       $2 == -100 && $3 != $1 {bad++}
       END {exit !(n > 0 && masked > 0 && bad == 0)}' ||
  fail "the labels are not the original bytes at the scored positions, or the ids are not masked there alone"

# Refused before training, exit 2, no file.
expect_exit 2 "$FLOWRUN" train "${MLP[@]}" --run-dir "$SCRATCH/r1" --dump-step "$SCRATCH/no/such/dir/d.h5"
expect_log "the directory $SCRATCH/no/such/dir does not exist"
expect_exit 2 "$FLOWRUN" train "${MLP[@]}" --run-dir "$SCRATCH/r2" --dump-step "$SCRATCH/r2.h5" --set precision.dtype=fp16
expect_log "precision.dtype: fp16 scales the gradients"
expect_exit 2 "$FLOWRUN" train "${MLP[@]}" --run-dir "$SCRATCH/r3" --dump-step "$SCRATCH/r3.h5" --detect-anomaly
expect_log "--detect-anomaly"
before=$(md5sum <"$SCRATCH/mlp/metrics.jsonl")
expect_exit 2 "$FLOWRUN" train "${MLP[@]}" --run-dir "$SCRATCH/mlp" --resume auto --dump-step "$SCRATCH/r4.h5"
expect_log "train.steps: --dump-step: the run has no step left to dump (resumed at step 1 of 1)"
[[ $(md5sum <"$SCRATCH/mlp/metrics.jsonl") == "$before" ]] || fail "the refused resume rewrote metrics.jsonl"
if command -v mpirun >/dev/null; then
  expect_exit 2 mpirun --allow-run-as-root --oversubscribe -np 2 "$FLOWRUN" train "${MLP[@]}" \
    --set parallel.data=2 --run-dir "$SCRATCH/r5" --dump-step "$SCRATCH/r5.h5"
  expect_log "parallel.data: --dump-step records one process's step, but this run has 2 processes"
fi
for r in r1 r2 r3 r4 r5; do [[ -e "$SCRATCH/$r.h5" ]] && fail "a refused run wrote $r.h5"; done
ls "$SCRATCH" | grep -q '\.tmp\.' && fail "a temporary file was left behind"
echo "the dump holds the step's batch, loss, parameters and the gradients the update used; refusals exit 2"

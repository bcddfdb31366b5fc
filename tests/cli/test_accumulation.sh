#!/usr/bin/env bash
# Gradient accumulation through the trainer: batch 64 as 4 micro-batches of 16 follows the same loss curve
# as one batch of 64 (the same samples per step; only the summation order differs), also with dropout (the
# masks are keyed by each sample's place in the step's batch, not by micro-batch), and a batch that does not
# split is refused with the invariant named.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
CFG="$SRC/tests/configs/tiny_mlp.yaml"
COMMON=(--set model.dropout=0.0 --set train.steps=20 --set train.log_every=1 --set train.eval_every=0 --no-progress)
expect_exit 0 "$FLOWRUN" train "$CFG" "${COMMON[@]}" --run-dir "$SCRATCH/big"
expect_exit 0 "$FLOWRUN" train "$CFG" "${COMMON[@]}" --run-dir "$SCRATCH/acc" --set train.micro_batch_size=16
grep -q '"grad_accumulation": 4\|grad_accumulation: 4' "$SCRATCH/acc/config.yaml" || fail "accumulation not derived"
paste <(grep -o '"loss": [^,]*' "$SCRATCH/big/metrics.jsonl") <(grep -o '"loss": [^,]*' "$SCRATCH/acc/metrics.jsonl") |
  awk '{ a = $2; b = $4; d = a - b; if (d < 0) d = -d; if (d > 1e-4 * a) { print "step " NR ": " a " vs " b; bad = 1 } ; n++ }
       END { if (n != 20) { print "expected 20 steps, got " n; exit 1 } exit bad }' ||
  fail "accumulated micro-batches do not follow the big batch"
# Dropout 0.1 (the tiny GPT): 2 micro-batches of 4 against the batch of 8, within 1e-5 at every step.
GPT=("$SRC/tests/configs/tiny_gpt.yaml" --set train.steps=5 --set train.eval_every=0 --no-progress)
expect_exit 0 "$FLOWRUN" train "${GPT[@]}" --run-dir "$SCRATCH/gpt-big"
expect_exit 0 "$FLOWRUN" train "${GPT[@]}" --run-dir "$SCRATCH/gpt-acc" --set train.micro_batch_size=4
rel=$(max_rel "$SCRATCH/gpt-big/metrics.jsonl" "$SCRATCH/gpt-acc/metrics.jsonl")
within "$rel" 1e-5 || fail "with dropout, 2 micro-batches of 4 differ from the batch of 8 by $rel"
echo "with dropout, 2 x 4 accumulation follows batch 8 within $rel"
expect_exit 2 "$FLOWRUN" train "$CFG" --set train.micro_batch_size=24 --run-dir "$SCRATCH/bad"
expect_log "train.batch_size"
echo "4 x 16 accumulation follows batch 64"

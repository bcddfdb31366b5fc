#!/usr/bin/env bash
# Too big to train is bad input found before anything is allocated: under `ulimit -v` a model whose planned
# memory (parameters, state, arena: what `flowrun plan` counts) exceeds the limit is refused with exit 2,
# both numbers and the largest tensors; a batch larger than the train split is refused before its
# allocation would fail; a normal config still trains under the same limit.
source "$(dirname "$0")/lib.sh"
FLOWRUN=$1 SRC=$2
GPT="$SRC/tests/configs/tiny_gpt.yaml"
MLP="$SRC/tests/configs/tiny_mlp.yaml"
LIMIT_KIB=$((8 * 1024 * 1024))  # 8 GiB of address space

limited() { (ulimit -v "$LIMIT_KIB"; exec "$@"); }

expect_exit 2 limited "$FLOWRUN" train "$GPT" --run-dir "$SCRATCH/big" --no-progress --set model.d_model=16384
expect_log "the training step needs"
expect_log "but this process may use at most"
expect_log "RLIMIT_AS"
expect_log "the largest tensors: "
expect_log "f32[16384,65536]"
[[ -e "$SCRATCH/big/metrics.jsonl" ]] && fail "a refused run started training"

expect_exit 2 limited "$FLOWRUN" train "$MLP" --run-dir "$SCRATCH/batch" --no-progress --set train.batch_size=2147483648
expect_log "train.batch_size: a batch of 2147483648 samples is larger than the"
expect_log "samples of the train split"

expect_exit 0 limited "$FLOWRUN" train "$MLP" --run-dir "$SCRATCH/ok" --no-progress --set train.steps=3
expect_log "done: 3 steps"
echo "memory limit ok"

#!/usr/bin/env bash
# `flowrun ops` lists every op the issue requires, with its kernels; bad usage exits 2.
set -euo pipefail
flowrun=$1
out=$("$flowrun" ops)
for op in matmul linear add sub mul div add_scalar mul_scalar relu gelu silu tanh sigmoid softmax log_softmax \
  cross_entropy nll_loss mse_loss layernorm rmsnorm batchnorm dropout embedding conv2d maxpool2d avgpool2d \
  global_avgpool reshape transpose permute slice concat split reduce_sum reduce_mean reduce_max cast sdpa; do
  grep -qE "^$op +cpu:" <<<"$out" || { echo "flowrun ops does not list $op with a cpu kernel"; exit 1; }
done
grep -qE "^matmul .*cpu:.*bf16" <<<"$out" || { echo "matmul has no bf16 kernel listed"; exit 1; }
"$flowrun" ops --help | grep -q "filter" || { echo "ops --help does not describe its argument"; exit 1; }
[ "$("$flowrun" ops gelu | grep -c '^gelu')" = 3 ] || { echo "filter did not keep gelu, gelu_bias_grad and gelu_grad"; exit 1; }
set +e
"$flowrun" nosuchverb >/dev/null 2>&1; rc=$?
set -e
[ $rc = 2 ] || { echo "unknown verb exited $rc, expected 2"; exit 1; }
"$flowrun" version | grep -q "^flowrun " || { echo "version output"; exit 1; }
echo "cli ops: ok"

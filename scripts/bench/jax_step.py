"""Time JAX training steps of one bench model; print one JSON line.

The JAX counterpart of torch_step.py: a step is forward + loss + gradient + optimizer update on a real batch,
one jax.jit-compiled function that donates the parameter, batchnorm-state and optimizer-state buffers. Each
batch is gathered (and put in a device array) before its step's clock starts; the clock stops once the
step's outputs are ready (block_until_ready). XLA compiles the step in the first warm-up step. The last line
of stdout is {"model", "mode": "jax", "bf16", "median_step_ms", "p10_step_ms", "p90_step_ms", "peak_rss_mib",
"import_rss_mib" (peak RSS right after `import jax`), "params", "threads", "jax", "batch", "items_per_step",
"unit", "steps", "warmup", "final_loss"}.

--threads T pins the process to the first T CPUs it may use before jax is imported: XLA sizes its CPU
thread pools from the affinity mask. With T = 1 Eigen's multi-threading is also switched off in XLA_FLAGS.

Usage: jax_step.py MODEL [--bf16] [--threads T] [--steps N] [--warmup W] [--data-dir DIR]
"""
import argparse
import json
import math
import os
import sys
import time

from bench_common import peak_rss_mib, percentile  # stdlib only at import: before limit_threads

# jax is imported in main(), after limit_threads(): the thread count has to be fixed before XLA starts.
MODELS = ("mlp", "cnn", "resnet", "gpt-tiny")  # jax_models.BENCH


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=MODELS)
    p.add_argument("--bf16", action="store_true", help="matmuls and convolutions in bfloat16, as torch.autocast")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    p.add_argument("--data-dir", default="data/cache", help="where fashion_mnist.h5, kjv.h5 ... live")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if a.threads < 1 or a.steps < 1 or a.warmup < 0:
        p.error("--threads and --steps must be >= 1, --warmup >= 0")
    return a


def limit_threads(threads):
    """Pins this process to its first `threads` allowed CPUs; to be called before numpy or jax is imported,
    while this is the only thread: threads started later (XLA's pools, OpenBLAS's) inherit the mask, and
    XLA and OpenBLAS size their pools from it. Returns the number of CPUs now allowed."""
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    os.sched_setaffinity(0, cpus)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if threads == 1:
        # One CPU still leaves Eigen's pool (and so XLA's intra-op parallelism) with threads of its own.
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    return len(cpus)


def main(argv):
    a = parse_args(argv)
    threads = limit_threads(a.threads)
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax_models as jm

    import_rss = peak_rss_mib()  # the jax libraries alone, before any model or data
    apply, params, state, opt, batch, kind = jm.build(a.model, a.seed)
    opt_state = opt.init(params)
    n_params = jm.param_count(params)
    train, _ = jm.load(a.data_dir, kind)
    batches = jm.Batches(train, batch, a.seed)
    step = jm.train_step(apply, opt, jnp.bfloat16 if a.bf16 else jnp.float32)

    times = []
    for i in range(a.warmup + a.steps):
        x, y = jax.block_until_ready(batches.next())
        t0 = time.perf_counter()
        params, state, opt_state, loss = jax.block_until_ready(step(params, state, opt_state, x, y))
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt * 1e3)
    loss = float(loss)
    if not math.isfinite(loss):
        sys.exit(f"jax_step: {a.model}: the loss is {loss}")
    times.sort()
    out = {
        "model": a.model, "mode": "jax", "bf16": a.bf16,
        "median_step_ms": percentile(times, 0.5), "p10_step_ms": percentile(times, 0.1),
        "p90_step_ms": percentile(times, 0.9), "peak_rss_mib": peak_rss_mib(),
        "import_rss_mib": import_rss, "params": n_params, "threads": threads, "jax": jax.__version__,
        "batch": batch, "items_per_step": batch * (jm.SEQ_LEN if kind == "kjv" else 1),
        "unit": "tokens/s" if kind == "kjv" else "samples/s", "steps": a.steps, "warmup": a.warmup,
        "final_loss": loss,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])

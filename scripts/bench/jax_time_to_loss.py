"""Train the gpt-tiny bench model in JAX until the KJV validation loss first reaches a target; print JSON.

The JAX counterpart of time_to_loss.py, with the same run: the same model, AdamW settings, batch, sampling
of the training data (its own permutation: see jax_models.Batches) and validation batches (the first
`--eval-batches` batches of 16 of the held-out last 10% of the bytes, in order), evaluated every E steps;
the training step is jax_models.train_step, as in jax_step.py. The clock starts before the model is built
and the data loaded, and includes the evaluations and XLA's compilation.
The last line of stdout is {"mode": "jax", "target", "reached", "step", "seconds", "val_loss", "threads",
"jax"}.

Usage: jax_time_to_loss.py [--target 2.0] [--eval-every 50] [--eval-batches 20] [--max-steps 3000] [--bf16]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jax_step import limit_threads  # noqa: E402  (stdlib only: jax is imported after it has run)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=float, default=2.0, help="validation loss in nats/byte")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-batches", type=int, default=20, help="= data.eval_batches of the flowrun run")
    p.add_argument("--max-steps", type=int, default=3000, help="give up after this many steps")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bf16", action="store_true", help="matmuls in bfloat16, as torch.autocast")
    p.add_argument("--data-dir", default=os.path.expanduser("~/.cache/flowrun"))
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if min(a.eval_every, a.eval_batches, a.max_steps, a.threads) < 1 or not a.target > 0:
        p.error("--eval-every, --eval-batches, --max-steps, --threads must be >= 1 and --target > 0")
    return a


def main(argv):
    a = parse_args(argv)
    start = time.perf_counter()
    threads = limit_threads(a.threads)
    import jax
    import jax.numpy as jnp

    import jax_models as jm

    cdt = jnp.bfloat16 if a.bf16 else jnp.float32
    apply, params, state, opt, batch, kind = jm.build("gpt-tiny", a.seed)
    opt_state = opt.init(params)
    train, val = jm.load(a.data_dir, kind)
    batches = jm.Batches(train, batch, a.seed)
    held_out = jm.val_batches(val, batch, a.eval_batches)
    step = jm.train_step(apply, opt, cdt)

    # Evaluated in fp32 also with --bf16, as time_to_loss.py evaluates outside torch.autocast.
    batch_loss = jax.jit(lambda params, x, y: jm.loss_of(apply, params, state, x, y, jnp.float32)[0])

    def val_loss(params):
        """Mean cross-entropy per byte over the validation batches (weighted by their tokens, as flowrun)."""
        total = sum(float(batch_loss(params, x, y)) * y.size for x, y in held_out)
        return total / sum(y.size for _, y in held_out)

    result = {"mode": "jax", "target": a.target, "reached": False, "step": None, "seconds": None,
              "val_loss": None, "threads": threads, "jax": jax.__version__}
    for i in range(1, a.max_steps + 1):
        x, y = batches.next()
        params, state, opt_state, _ = step(params, state, opt_state, x, y)
        if i % a.eval_every == 0:
            v = val_loss(params)
            print(f"step {i}: val_loss {v:.4f} at {time.perf_counter() - start:.1f} s", file=sys.stderr)
            result.update(step=i, seconds=time.perf_counter() - start, val_loss=v)
            if v <= a.target:
                result["reached"] = True
                break
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])

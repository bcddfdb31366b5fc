"""Time PyTorch training steps of one bench model, eager or torch.compile'd; print one JSON line.

A step is zero_grad + forward + loss + backward + optimizer.step on a real batch, the same as flowrun's
`flowrun time`. Each batch is gathered before its step's clock starts (flowrun's loader prepares batches ahead
on another thread). The last line of stdout is
{"model", "mode", "median_step_ms", "p10_step_ms", "p90_step_ms", "peak_rss_mib", "import_rss_mib" (peak
RSS right after `import torch`), "params", "threads", "torch", "batch", "items_per_step", "unit", "steps", "warmup", "final_loss"}.

Usage: torch_step.py MODEL [--compile] [--bf16] [--threads T] [--steps N] [--warmup W] [--data-dir DIR]
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models as tm  # noqa: E402
from bench_common import peak_rss_mib, percentile  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=sorted(tm.BENCH))
    p.add_argument("--bf16", action="store_true", help="forward and loss under torch.autocast(cpu, bfloat16)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (default: eager)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    p.add_argument("--data-dir", default="data/cache", help="where fashion_mnist.h5, kjv.h5 ... live")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if a.threads < 1 or a.steps < 1 or a.warmup < 0:
        p.error("--threads and --steps must be >= 1, --warmup >= 0")
    return a


def main(argv):
    a = parse_args(argv)
    import_rss = peak_rss_mib()  # the torch libraries alone, before any model or data
    torch.set_num_threads(a.threads)
    model, opt, batch, kind = tm.build(a.model, a.seed)
    train, _ = tm.load(a.data_dir, kind)
    batches = tm.Batches(train, batch, a.seed)
    fwd = torch.compile(model) if a.compile else model
    model.train()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = tm.loss_of(fwd, x, y)
        loss.backward()
        opt.step()
        return loss

    times = []
    for i in range(a.warmup + a.steps):
        x, y = batches.next()
        t0 = time.perf_counter()
        loss = step(x, y)
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt * 1e3)
    if not torch.isfinite(loss):
        sys.exit(f"torch_step: {a.model}: the loss is {loss.item()}")
    times.sort()
    out = {
        "model": a.model, "mode": "compiled" if a.compile else "eager", "bf16": a.bf16,
        "median_step_ms": percentile(times, 0.5), "p10_step_ms": percentile(times, 0.1),
        "p90_step_ms": percentile(times, 0.9), "peak_rss_mib": peak_rss_mib(),
        "import_rss_mib": import_rss,
        "params": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "batch": batch,
        "items_per_step": batch * (tm.SEQ_LEN if kind == "kjv" else 1),
        "unit": "tokens/s" if kind == "kjv" else "samples/s", "steps": a.steps, "warmup": a.warmup,
        "final_loss": loss.item(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])

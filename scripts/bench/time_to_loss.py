"""Train the gpt-tiny bench model in PyTorch until the KJV validation loss first reaches a target; print JSON.

The run mirrors `flowrun train configs/bench/gpt_tiny.yaml --set train.eval_every=E`: the same model,
AdamW settings, batch, training samples and validation batches (the first `--eval-batches` batches of 16 of
the held-out last 10% of the bytes, in order), evaluated every E steps. The clock starts before the model is
built and the data loaded, as flowrun's `time` in metrics.jsonl does, and includes the evaluations (and with
--compile, the compilation). The last line of stdout is
{"mode", "target", "reached", "step", "seconds", "val_loss", "threads", "torch"}.

Usage: time_to_loss.py [--target 2.0] [--eval-every 50] [--eval-batches 20] [--max-steps 3000] [--compile] [--bf16]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models as tm  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=float, default=2.0, help="validation loss in nats/byte")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-batches", type=int, default=20, help="= data.eval_batches of the flowrun run")
    p.add_argument("--max-steps", type=int, default=3000, help="give up after this many steps")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bf16", action="store_true", help="forward and loss under torch.autocast(cpu, bfloat16)")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--data-dir", default=os.path.expanduser("~/.cache/flowrun"))
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if min(a.eval_every, a.eval_batches, a.max_steps, a.threads) < 1 or not a.target > 0:
        p.error("--eval-every, --eval-batches, --max-steps, --threads must be >= 1 and --target > 0")
    return a


@torch.no_grad()
def val_loss(model, batches):
    """Mean cross-entropy per byte over the validation batches (weighted by their tokens, as flowrun)."""
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        logits = model(x)
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        count += y.numel()
    model.train()
    return total / count


def main(argv):
    a = parse_args(argv)
    start = time.perf_counter()
    torch.set_num_threads(a.threads)
    model, opt, batch, kind = tm.build("gpt-tiny", a.seed)
    train, val = tm.load(a.data_dir, kind)
    batches = tm.Batches(train, batch, a.seed)
    held_out = tm.val_batches(val, batch, a.eval_batches)
    fwd = torch.compile(model) if a.compile else model
    result = {"mode": "compiled" if a.compile else "eager", "target": a.target, "reached": False,
              "step": None, "seconds": None, "val_loss": None, "threads": a.threads, "torch": torch.__version__}
    for step in range(1, a.max_steps + 1):
        x, y = batches.next()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = tm.loss_of(fwd, x, y)
        loss.backward()
        opt.step()
        if step % a.eval_every == 0:
            v = val_loss(fwd, held_out)
            print(f"step {step}: val_loss {v:.4f} at {time.perf_counter() - start:.1f} s", file=sys.stderr)
            result.update(step=step, seconds=time.perf_counter() - start, val_loss=v)
            if v <= a.target:
                result["reached"] = True
                break
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])

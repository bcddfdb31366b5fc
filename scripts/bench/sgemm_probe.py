"""The machine's fp32 GEMM ceiling through PyTorch: best of several 2048^3 torch.mm at T threads; one JSON line.

Usage: sgemm_probe.py [--threads T] [--n 2048] [--reps 5]
"""
import argparse
import json
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    x, y = torch.rand(a.n, a.n), torch.rand(a.n, a.n)
    out = torch.empty(a.n, a.n)
    torch.mm(x, y, out=out)  # first call: BLAS buffers, page faults
    best = float("inf")
    for _ in range(a.reps):
        t0 = time.perf_counter()
        torch.mm(x, y, out=out)
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"probe": "torch.mm", "n": a.n, "threads": a.threads, "gflops": 2.0 * a.n**3 / best / 1e9}))


if __name__ == "__main__":
    main()

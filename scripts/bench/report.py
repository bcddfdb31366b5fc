"""Turn one bench_vs_torch.sh results directory into its markdown report (standard library only).

Reads DIR/meta.json (date, cpu, torch, jax, notes), DIR/runs.jsonl (one record per timed run: the JSON line
of `flowrun time --json`, torch_step.py or jax_step.py, plus "impl" and "round"), DIR/sgemm.jsonl,
DIR/fma.jsonl (the FMA ceiling, when flowrun_bench was built) and DIR/ttl.jsonl. Per model and thread count it takes the median over rounds of each run's median step time and
the largest peak RSS, and prints one table, with flowrun's time over the fastest peer's and its share of the
sgemm rate (against the largest probe, and round by round against the probe run just before it); then the
time-to-loss table.

Usage: report.py DIR
"""
import json
import os
import statistics
import sys

IMPLS = ("flowrun", "eager", "compiled", "jax")
PEERS = IMPLS[1:]


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def fmt(v, digits=1):
    return "-" if v is None else f"{v:,.{digits}f}"


def ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def pct(v):
    return "-" if v is None else f"{100 * v:.0f}%"


def rate(v):
    if v is None:
        return "-"
    return f"{v / 1000:.1f}k" if v >= 10000 else f"{v:.0f}"


def summarise(runs):
    """{(model, threads): {impl: {"ms", "rss", "record"}}} from the per-run records."""
    groups = {}
    for r in runs:
        groups.setdefault((r["model"], r["threads"]), {}).setdefault(r["impl"], []).append(r)
    out = {}
    for key, per_impl in groups.items():
        out[key] = {impl: {"ms": statistics.median(x["median_step_ms"] for x in rs),
                           "rss": max(x["peak_rss_mib"] for x in rs), "record": rs[-1], "rounds": len(rs)}
                    for impl, rs in per_impl.items()}
    return out


def peak_for(sgemm, threads):
    vals = [s["gflops"] for s in sgemm if s["threads"] == threads]
    return max(vals) if vals else None


def round_share(runs, sgemm, model, threads):
    """Median over rounds of flowrun's GFLOP/s over the sgemm probe run just before it (None without them)."""
    probes = {s["round"]: s["gflops"] for s in sgemm
              if s.get("model") == model and s["threads"] == threads and "round" in s}
    shares = [r["flops_per_step"] / r["median_step_ms"] / 1e6 / probes[r["round"]] for r in runs
              if r["impl"] == "flowrun" and r["model"] == model and r["threads"] == threads
              and r.get("flops_per_step") and r["round"] in probes]
    return statistics.median(shares) if shares else None


def step_table(meta, runs, sgemm):
    rows = [
        "| model | threads | flowrun ms | eager ms | compiled ms | jax ms | flowrun/eager | flowrun/compiled "
        "| flowrun / best peer | throughput flowrun / eager / compiled / jax "
        "| peak RSS MiB flowrun / eager / compiled / jax | flowrun GFLOP/s | sgemm peak GFLOP/s "
        "| share of sgemm, per round |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = {m: i for i, m in enumerate(meta.get("models", []))}
    for (model, threads), s in sorted(summarise(runs).items(), key=lambda kv: (order.get(kv[0][0], 99), -kv[0][1])):
        ms = {i: s[i]["ms"] if i in s else None for i in IMPLS}
        rss = {i: s[i]["rss"] if i in s else None for i in IMPLS}
        peer_rec = next((s[i]["record"] for i in PEERS if i in s), {})
        items, unit = peer_rec.get("items_per_step"), peer_rec.get("unit", "samples/s")
        best = min((i for i in PEERS if ms[i] is not None), key=lambda i: ms[i], default=None)
        vs_best = f"{ratio(ms['flowrun'], ms[best])} ({best})" if best and ms["flowrun"] is not None else "-"
        thr = {i: items * 1000.0 / ms[i] if items and ms[i] else None for i in IMPLS}
        flops = s["flowrun"]["record"].get("flops_per_step") if "flowrun" in s else None
        gflops = flops / ms["flowrun"] / 1e6 if flops and ms["flowrun"] else None
        rows.append(
            f"| {model} | {threads} | {' | '.join(fmt(ms[i], 2) for i in IMPLS)} "
            f"| {ratio(ms['flowrun'], ms['eager'])} | {ratio(ms['flowrun'], ms['compiled'])} | {vs_best} "
            f"| {' / '.join(rate(thr[i]) for i in IMPLS)} {unit} "
            f"| {' / '.join(fmt(rss[i], 0) for i in IMPLS)} | {fmt(gflops)} | {fmt(peak_for(sgemm, threads))} "
            f"| {pct(round_share(runs, sgemm, model, threads))} |")
    return rows


def ttl_table(ttl):
    if not ttl:
        return []
    flowrun = next((t for t in ttl if t["impl"] == "flowrun" and t.get("reached")), None)
    rows = ["", f"Time to validation loss {ttl[0]['target']} nats/byte on KJV (gpt-tiny, {ttl[0]['threads']} threads; "
            "wall time from the start of the run, evaluations included):", "",
            "| run | reached | at step | val loss | seconds | vs flowrun |", "|---|---|---:|---:|---:|---:|"]
    for t in ttl:
        vs = ratio(t["seconds"], flowrun["seconds"]) if flowrun and t.get("reached") else "-"
        rows.append(f"| {t['impl']} | {'yes' if t.get('reached') else 'no'} | {t.get('step') or '-'} "
                    f"| {fmt(t.get('val_loss'), 4)} | {fmt(t.get('seconds'))} | {vs} |")
    if any(t.get("time_from") == "step" for t in ttl):
        rows += ["", "flowrun's seconds are those of the step record at the evaluation's step (its eval records carry "
                 "no `time`), so they leave out its evaluation time."]
    return rows


def main(argv):
    if len(argv) != 1:
        sys.exit(__doc__.strip().splitlines()[-1])
    d = argv[0]
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    runs, sgemm = read_jsonl(os.path.join(d, "runs.jsonl")), read_jsonl(os.path.join(d, "sgemm.jsonl"))
    bf16 = meta.get("precision") == "bf16"
    jax_prec = f"; JAX {'matmuls and convolutions in bfloat16' if bf16 else 'fp32'}" if meta.get("jax") else ""
    lines = [f"Precision: {meta.get('precision', 'fp32')} (flowrun precision.dtype; PyTorch "
             f"{'torch.autocast(cpu, bfloat16)' if bf16 else 'fp32'}{jax_prec}).", ""]
    jax = f", JAX {meta['jax']}" if meta.get("jax") else ""
    lines += [f"Measured {meta['date']} on {meta['cpu']} ({meta['cpus']} CPUs); flowrun {meta['flowrun']}, "
             f"PyTorch {meta['torch']} ({meta['torch_source']}){jax}; {meta['steps']} timed steps after "
             f"{meta['warmup']} warm-up, median of {meta['rounds']} alternating rounds; step = zero-grad + forward "
             f"+ loss + backward + optimizer step{' (JAX: one jax.jit-compiled function)' if jax else ''}.", ""]
    lines += step_table(meta, runs, sgemm)
    probes = ", ".join(f"{s['probe']} {s['threads']}T {s['gflops']:.0f}" for s in sgemm if "round" not in s)
    lines += ["", f"sgemm probes (GFLOP/s): {probes or 'none'}."]
    for f in read_jsonl(os.path.join(d, "fma.jsonl")):
        best = max((s["gflops"] for s in sgemm if "round" not in s and s["threads"] == f["threads"]), default=None)
        share = f", the best sgemm probe {100 * best / f['gflops']:.0f}% of it" if best else ""
        lines.append(f"FMA ceiling (flowrun_bench BM_fma_peak, independent multiply-add chains) at {f['threads']}T: "
                     f"{f['gflops']:.0f} GFLOP/s{share}.")
    per_round = [s["gflops"] for s in sgemm if "round" in s]
    if per_round:
        lines.append(f"The {len(per_round)} probes of oneDNN's sgemm right before each flowrun round ranged "
                     f"{min(per_round):.0f}-{max(per_round):.0f} GFLOP/s: the last column divides each round's "
                     "flowrun GFLOP/s by its own probe, the median over rounds.")
    for name, impls, module in (("PyTorch", ("eager", "compiled"), "torch"), ("JAX", ("jax",), "jax")):
        imports = [r["import_rss_mib"] for r in runs if r["impl"] in impls and "import_rss_mib" in r]
        if imports:
            lines.append(f"{name}'s peak RSS includes {statistics.median(imports):.0f} MiB already resident right "
                         f"after `import {module}`, before any model or data.")
    lines += [f"Note: {n}" for n in meta.get("notes", [])]
    lines += ttl_table(read_jsonl(os.path.join(d, "ttl.jsonl")))
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])

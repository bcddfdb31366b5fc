"""flowrun side of the time-to-loss race: run `flowrun train`, stop it once the validation loss reaches a target.

Starts the given flowrun command line, follows RUN_DIR/metrics.jsonl, and as soon as an eval record
(`"split": "val"`) has val_loss <= target, terminates the trainer (its own child) and prints one JSON line
{"impl": "flowrun", "target", "reached", "step", "seconds", "val_loss", "threads"}. `seconds` is the eval
record's `time` (seconds since the start of training, evaluation included); records written before eval
records had `time` fall back to the step record of the same step, noted as "time_from": "step".

Usage: flowrun_ttl.py --target T --run-dir DIR --threads N -- FLOWRUN ARGS...
"""
import argparse
import json
import os
import subprocess
import sys
import time


def scan(path, target, seen):
    """Updates `seen` (step -> record) from the metrics file; returns the first eval record at or under target."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break  # a line still being written
            r = json.loads(line)
            if r.get("split") == "val":
                seen.setdefault(("val", r["step"]), r)
                if r["val_loss"] <= target:
                    return r
            else:
                seen.setdefault(("train", r["step"]), r)
    return None


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=float, required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    metrics = os.path.join(a.run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    seen = {}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    hit = None
    while hit is None and proc.poll() is None:
        time.sleep(0.5)
        hit = scan(metrics, a.target, seen)
    if proc.poll() is None:
        proc.terminate()
        proc.wait()
    elif hit is None:
        hit = scan(metrics, a.target, seen)
    last_val = max((k[1] for k in seen if k[0] == "val"), default=None)
    rec = hit or (seen[("val", last_val)] if last_val is not None else {})
    out = {"impl": "flowrun", "target": a.target, "reached": hit is not None, "step": rec.get("step"),
           "seconds": None, "val_loss": rec.get("val_loss"), "threads": a.threads,
           "exit_code": None if hit else proc.returncode}
    if "time" in rec:
        out["seconds"] = rec["time"]
    elif ("train", rec.get("step")) in seen:
        out["seconds"], out["time_from"] = seen[("train", rec["step"])]["time"], "step"
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])

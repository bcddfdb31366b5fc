#!/usr/bin/env python3
"""Numerical parity of flowrun's zoo models with PyTorch: one training step, tensor by tensor.

For each model this script
  1. writes a small fp32 config (CONFIGS below, written as JSON, which flowrun reads as YAML) and runs
     `flowrun train CFG --set train.steps=1 --dump-step STEP.h5`: the dump holds the step's batch, loss,
     every parameter before the step and its gradient (lib/train/step_dump.h), and the run's checkpoint
     after step 1 holds the updated weights (and BatchNorm's running statistics);
  2. builds the same architecture in PyTorch (hand-written torch.nn twins below, not a library's models),
     loads flowrun's weights into it by name (the maps are the `flowrun_names` methods: `--names MODEL`
     prints one), runs the same batch with dropout off and BatchNorm in training mode, takes the mean
     cross entropy (ignore_index -100) and its gradients, and takes one step of the same optimizer
     (SGD / Adam / AdamW with flowrun's hyper-parameters, the dump's learning rate, no weight decay on 1-d
     parameters as optimizer.decay_1d: false, gradient clipping as train.clip_grad_norm);
  3. compares: loss |a - b| / |b|; each gradient max|a - b| / max|b| over the tensor; each updated tensor
     (parameters and running statistics) max|a - b| / max|b|. a is flowrun, b PyTorch.

PyTorch runs in float64 from flowrun's f32 weights (the reference, which the pass criteria apply to:
1e-5 for each), and in float32 too (reported, for scale: two f32 implementations differ by about as much).
Exit status 0 when every model passes, 1 when one fails, 2 on bad usage.

    /work/main/.venv-bench/bin/python scripts/check_parity.py               # every model
    .venv-bench/bin/python scripts/check_parity.py --models gpt,resnet --keep /tmp/parity
    .venv-bench/bin/python scripts/check_parity.py --names gpt             # flowrun name -> PyTorch tensor

Needs torch, numpy and h5py (the bench venv of scripts/bench_vs_torch.sh has them) and a built flowrun
(--flowrun, default build/apps/flowrun). Not needed to train: it is a data check.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-5

# --- the configs ------------------------------------------------------------------------------------
# Small enough to run in seconds on two CPU cores, large enough that every layer kind of the model is
# there; dropout 0 (flowrun's masks are its own Philox draws). Each exercises another optimizer path.

COMMON_TRAIN = {"steps": 1, "seed": 11, "log_every": 1, "eval_every": 0, "checkpoint_every": 1,
                "async_checkpoint": False}

CONFIGS = {
    # SGD with Nesterov momentum and weight decay; two hidden layers with GELU.
    "mlp": {
        "model": {"zoo": "mlp", "hidden": [64, 32], "activation": "gelu", "dropout": 0.0},
        "data": {"dataset": "fashion_mnist", "eval_batches": 1},
        "train": {"batch_size": 32},
        "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
    },
    # Plain SGD with momentum and dampening; conv, pool, linear.
    "cnn": {
        "model": {"zoo": "cnn", "channels": [8, 16], "hidden": [32], "dropout": 0.0},
        "data": {"dataset": "fashion_mnist", "eval_batches": 1},
        "train": {"batch_size": 16},
        "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.1},
    },
    # BatchNorm in training mode (batch statistics, running statistics updated), projection shortcuts,
    # Adam with L2 weight decay (optimizer.type adam: the decay is added to the gradient).
    "resnet": {
        "model": {"zoo": "resnet", "depth": 8, "width": 8},
        "data": {"dataset": "fashion_mnist_3x32", "eval_batches": 1},
        "train": {"batch_size": 16},
        "optimizer": {"type": "adam", "lr": 0.01, "weight_decay": 5e-4},
    },
    # AdamW with decoupled decay, gradient clipping (train.clip_grad_norm, which binds at this size) and
    # gradient accumulation (2 micro-batches of 4: the loss is their mean).
    "gpt": {
        "model": {"zoo": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "dropout": 0.0},
        "data": {"dataset": "kjv", "seq_len": 32, "eval_batches": 1},
        "train": {"batch_size": 8, "micro_batch_size": 4, "clip_grad_norm": 0.5},
        "optimizer": {"type": "adamw", "lr": 3e-3, "weight_decay": 0.1, "beta2": 0.95},
    },
}

# flowrun's defaults for what a config above leaves out (configs/README.md, `flowrun check --schema`).
OPT_DEFAULTS = {"momentum": 0.0, "dampening": 0.0, "nesterov": False, "weight_decay": 0.0, "beta1": 0.9,
                "beta2": 0.999, "eps": 1e-8, "decay_1d": False}


def param(cfg, key, default):
    return cfg["model"].get(key, default)


# --- the PyTorch twins ------------------------------------------------------------------------------
# Each twin's flowrun_names() is the map from flowrun's parameter (and state) names (models/README.md,
# "Names"; `flowrun inspect CKPT` lists a checkpoint's) to the PyTorch tensor holding the same values in
# the same layout: linear weights are (out, in) on both sides, conv weights (out, in, kh, kw).


class MLP(nn.Module):
    """models/mlp.yaml: flatten, `hidden.<i>/fc` linear + activation per hidden width, `head` linear."""

    def __init__(self, cfg, spec):
        super().__init__()
        widths = [spec["features"]] + list(param(cfg, "hidden", [512, 512]))
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.act = param(cfg, "activation", "relu")
        self.head = nn.Linear(widths[-1], spec["classes"])

    def forward(self, x):
        h = x.flatten(1)
        for lin in self.hidden:
            h = activation(lin(h), self.act)
        return self.head(h)

    def flowrun_names(self):
        m = {}
        for i, lin in enumerate(self.hidden):
            m[f"hidden.{i}/fc/w"], m[f"hidden.{i}/fc/b"] = lin.weight, lin.bias
        m["head/w"], m["head/b"] = self.head.weight, self.head.bias
        return m


def activation(x, kind):
    if kind == "none":
        return x
    if kind == "gelu":
        return F.gelu(x)  # flowrun's `gelu` is the exact (erf) form; `gelu_tanh` the tanh one
    return getattr(torch, kind)(x) if kind in ("tanh", "sigmoid") else getattr(F, kind)(x)


class CNN(nn.Module):
    """models/cnn.yaml: per `channels` entry `conv.<i>/conv2d0` (padding kernel // 2) + ReLU + 2x2 max pool,
    flatten, `fc.<i>/linear0` + ReLU per hidden width, `head`."""

    def __init__(self, cfg, spec):
        super().__init__()
        k = param(cfg, "kernel", 3)
        chans = [spec["shape"][0]] + list(param(cfg, "channels", [32, 64]))
        self.convs = nn.ModuleList(nn.Conv2d(a, b, k, padding=k // 2) for a, b in zip(chans, chans[1:]))
        h, w = spec["shape"][1], spec["shape"][2]
        for _ in self.convs:
            h, w = h // 2, w // 2
        widths = [chans[-1] * h * w] + list(param(cfg, "hidden", [128]))
        self.fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.head = nn.Linear(widths[-1], spec["classes"])

    def forward(self, x):
        for c in self.convs:
            x = F.max_pool2d(F.relu(c(x)), 2)
        x = x.flatten(1)
        for f in self.fcs:
            x = F.relu(f(x))
        return self.head(x)

    def flowrun_names(self):
        m = {}
        for i, c in enumerate(self.convs):
            m[f"conv.{i}/conv2d0/w"], m[f"conv.{i}/conv2d0/b"] = c.weight, c.bias
        for i, f in enumerate(self.fcs):
            m[f"fc.{i}/linear0/w"], m[f"fc.{i}/linear0/b"] = f.weight, f.bias
        m["head/w"], m["head/b"] = self.head.weight, self.head.bias
        return m


def bn_names(m, prefix, bn):
    m[f"{prefix}/gamma"], m[f"{prefix}/beta"] = bn.weight, bn.bias
    m[f"{prefix}/running_mean"], m[f"{prefix}/running_var"] = bn.running_mean, bn.running_var


class ResBlock(nn.Module):
    """One `residual` of models/resnet.yaml: convs `conv2d<j>` each followed by `batchnorm<j>` (ReLU between),
    plus a 1x1 conv + BN projection under `shortcut/` where the shape changes; ReLU after the sum."""

    def __init__(self, cin, width, stride, bottleneck, project):
        super().__init__()
        out = width * (4 if bottleneck else 1)
        if bottleneck:
            shapes = [(cin, width, 1, 1), (width, width, 3, stride), (width, out, 1, 1)]
        else:
            shapes = [(cin, width, 3, stride), (width, width, 3, 1)]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, k, stride=s, padding=k // 2, bias=False) for a, b, k, s in shapes)
        self.bns = nn.ModuleList(nn.BatchNorm2d(b) for _, b, _, _ in shapes)
        self.proj = nn.Conv2d(cin, out, 1, stride=stride, bias=False) if project else None
        self.proj_bn = nn.BatchNorm2d(out) if project else None

    def forward(self, x):
        h = x
        for j, (c, bn) in enumerate(zip(self.convs, self.bns)):
            h = bn(c(h))
            if j + 1 < len(self.convs):
                h = F.relu(h)
        s = self.proj_bn(self.proj(x)) if self.proj is not None else x
        return F.relu(h + s)

    def flowrun_names(self, prefix, m):
        for j, (c, bn) in enumerate(zip(self.convs, self.bns)):
            m[f"{prefix}/conv2d{j}/w"] = c.weight
            bn_names(m, f"{prefix}/batchnorm{j}", bn)
        if self.proj is not None:
            m[f"{prefix}/shortcut/conv2d0/w"] = self.proj.weight
            bn_names(m, f"{prefix}/shortcut/batchnorm0", self.proj_bn)


class ResNet(nn.Module):
    """models/resnet.yaml: `stem` conv + `stem_bn`, `stage.<s>/block.<i>` residual blocks, global average
    pool, `head` linear."""

    def __init__(self, cfg, spec):
        super().__init__()
        depth, width = param(cfg, "depth", 20), param(cfg, "width", 16)
        bottleneck = param(cfg, "block", "basic") == "bottleneck"
        n = (depth - 2) // (9 if bottleneck else 6)
        self.stem = nn.Conv2d(spec["shape"][0], width, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(width)
        self.blocks, cin = nn.ModuleList(), width
        for s in range(3):
            w = width * 2**s
            for i in range(n):
                project = i == 0 and (s > 0 or bottleneck)
                self.blocks.append(ResBlock(cin, w, 2 if s > 0 and i == 0 else 1, bottleneck, project))
                cin = w * (4 if bottleneck else 1)
        self.n = n
        self.head = nn.Linear(cin, spec["classes"])

    def forward(self, x):
        x = F.relu(self.stem_bn(self.stem(x)))
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean(dim=(2, 3)))

    def flowrun_names(self):
        m = {"stem/w": self.stem.weight}
        bn_names(m, "stem_bn", self.stem_bn)
        for k, b in enumerate(self.blocks):
            b.flowrun_names(f"stage.{k // self.n}/block.{k % self.n}", m)
        m["head/w"], m["head/b"] = self.head.weight, self.head.bias
        return m


class GPTBlock(nn.Module):
    """`transformer_block` (GPT-2 pre-LN): x + attn/proj(sdpa(attn/qkv(ln1(x)))), then
    x + mlp/proj(gelu_tanh(mlp/fc(ln2(x)))); qkv is one linear, q | k | v along its output."""

    def __init__(self, d, heads, ratio=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_proj = nn.Linear(d, ratio * d), nn.Linear(ratio * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    def flowrun_names(self, p, m):
        for name, mod in (("ln1", self.ln1), ("ln2", self.ln2)):
            m[f"{p}/{name}/gamma"], m[f"{p}/{name}/beta"] = mod.weight, mod.bias
        for name, mod in (("attn/qkv", self.qkv), ("attn/proj", self.proj), ("mlp/fc", self.fc),
                          ("mlp/proj", self.fc_proj)):
            m[f"{p}/{name}/w"], m[f"{p}/{name}/b"] = mod.weight, mod.bias


class GPT(nn.Module):
    """models/gpt.yaml: `wte` token and `wpe` position embeddings, `blocks.<i>`, `ln_f`, logits = h @ wte^T
    (the tied head has no parameter of its own: wte's gradient sums both uses)."""

    def __init__(self, cfg, spec):
        super().__init__()
        d, vocab = param(cfg, "d_model", 256), param(cfg, "vocab_size", spec["classes"])
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(spec["seq_len"], d)
        self.blocks = nn.ModuleList(GPTBlock(d, param(cfg, "n_head", 4)) for _ in range(param(cfg, "n_layer", 4)))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)

    def forward(self, idx):
        h = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        for b in self.blocks:
            h = b(h)
        return self.ln_f(h) @ self.wte.weight.t()

    def flowrun_names(self):
        m = {"wte/w": self.wte.weight, "wpe/w": self.wpe.weight}
        for i, b in enumerate(self.blocks):
            b.flowrun_names(f"blocks.{i}", m)
        m["ln_f/gamma"], m["ln_f/beta"] = self.ln_f.weight, self.ln_f.bias
        return m


TWINS = {"mlp": MLP, "cnn": CNN, "resnet": ResNet, "gpt": GPT}


# --- one model's check ------------------------------------------------------------------------------


def read_group(f, group):
    out = {}
    if group not in f:
        return out

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            out[name] = obj[...]
    f[group].visititems(visit)
    return out


def data_spec(dump):
    """What a twin needs to know of the data, from the batch flowrun trained on."""
    x, y = dump["x"], dump["y"]
    text = x.dtype == np.int64
    return {"text": text, "shape": list(x.shape[1:]), "features": int(np.prod(x.shape[1:])),
            "seq_len": x.shape[1] if text else 0, "classes": dump["classes"]}


def run_flowrun(flowrun, name, cfg, work):
    """Trains one step; returns the dump and the checkpoint after it, as dicts of numpy arrays."""
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, f"{name}.yaml")
    full = {k: dict(v) for k, v in cfg.items()}
    full["train"] = {**COMMON_TRAIN, **cfg.get("train", {})}
    with open(path, "w") as f:
        json.dump(full, f, indent=1)  # JSON is YAML
    dump_path, run_dir = os.path.join(work, "step.h5"), os.path.join(work, "run")
    cmd = [flowrun, "train", path, "--run-dir", run_dir, "--dump-step", dump_path, "--no-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    with h5py.File(dump_path, "r") as f:
        if f.attrs["format"] != b"flowrun-step-dump" and f.attrs["format"] != "flowrun-step-dump":
            raise RuntimeError(f"{dump_path}: not a flowrun step dump")
        dump = {"x": f["x"][...], "y": f["y"][...], "params": read_group(f, "params"),
                "grads": read_group(f, "grads"), "state": read_group(f, "state"),
                "mlm": read_group(f, "mlm"), "micro_loss": f["micro_loss"][...],
                "loss": float(f.attrs["loss"]), "lr": float(f.attrs["lr"]),
                "accumulation": int(f.attrs["grad_accumulation"]), "step": int(f.attrs["step"])}
    ckpt_path = os.path.join(run_dir, "checkpoints", "step_00000001.h5")
    with h5py.File(ckpt_path, "r") as f:
        ckpt = {"params": read_group(f, "params"), "state": read_group(f, "state")}
    return dump, ckpt


def num_classes(cfg, dump):
    """The width of the head: the data's classes (10 for Fashion-MNIST) or the text vocabulary (bytes)."""
    return 256 if dump["x"].dtype == np.int64 else 10


def make_optimizer(cfg, model, names, lr):
    o = {**OPT_DEFAULTS, **cfg["optimizer"]}
    decay, rest = [], []
    for n, t in names.items():
        if isinstance(t, nn.Parameter):
            (decay if t.dim() >= 2 or o["decay_1d"] else rest).append(t)
    groups = [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": rest, "weight_decay": 0.0}]
    if o["type"] == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=o["momentum"], dampening=o["dampening"],
                               nesterov=o["nesterov"])
    betas = (o["beta1"], o["beta2"])
    if o["type"] == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=betas, eps=o["eps"])
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=o["eps"])


def rel(a, b):
    """max|a - b| / max|b| over a tensor (max|a - b| where b is all zeros)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = np.max(np.abs(a - b)) if a.size else 0.0
    s = np.max(np.abs(b)) if b.size else 0.0
    return d / s if s > 0 else d


def torch_step(name, cfg, dump, dtype, flowrun_grads=False):
    """PyTorch's loss, gradients and updated tensors for the dump's batch, in `dtype`. With flowrun_grads
    the optimizer steps from flowrun's gradients instead of its own (the step alone, compared)."""
    torch.manual_seed(0)
    spec = data_spec(dump)
    model = TWINS[name](cfg, spec).to(dtype)
    names = model.flowrun_names()
    flow = {**dump["params"], **{k: v for k, v in dump["state"].items() if not k.startswith("opt/")}}
    missing = sorted(set(flow) - set(names))
    extra = sorted(set(names) - set(flow))
    if missing or extra:
        raise RuntimeError(f"{name}: the twin's names do not match flowrun's: flowrun only {missing}, "
                           f"PyTorch only {extra}")
    with torch.no_grad():
        for n, t in names.items():
            if tuple(t.shape) != flow[n].shape:
                raise RuntimeError(f"{name}: {n} is {flow[n].shape} in flowrun, {tuple(t.shape)} in PyTorch")
            t.copy_(torch.from_numpy(flow[n]).to(dtype))
    model.train()
    x = torch.from_numpy(dump["x"])
    x = x if spec["text"] else x.to(dtype)
    y = torch.from_numpy(dump["y"]).long()
    acc = dump["accumulation"]
    # Under accumulation flowrun's loss is the mean of the micro-batches' mean losses (and BatchNorm sees
    # each micro-batch alone): the same here, one micro-batch after the other.
    loss = 0
    for xs, ys in zip(x.chunk(acc), y.chunk(acc)):
        logits = model(xs)
        loss = loss + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ys.reshape(-1), ignore_index=-100)
    loss = loss / acc
    loss.backward()
    trained = {n: t for n, t in names.items() if isinstance(t, nn.Parameter)}
    grads = {n: t.grad.detach().double().numpy().copy() for n, t in trained.items()}
    if flowrun_grads:
        for n, t in trained.items():
            t.grad = torch.from_numpy(dump["grads"][n]).to(dtype)
    clip = cfg.get("train", {}).get("clip_grad_norm", 0.0)
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(list(trained.values()), clip)
    make_optimizer(cfg, model, names, dump["lr"]).step()
    after = {n: t.detach().double().numpy().copy() for n, t in names.items()}
    return loss.item(), grads, after


def worst(errs):
    n = max(errs, key=errs.get)
    return errs[n], n


def check_model(name, flowrun, work):
    """One row: flowrun against PyTorch float64 and float32. The gradients pass where they agree with
    either within TOL (tensor by tensor: a gradient whose f32 value is ill-conditioned, e.g. under
    cancellation, is as far from float64 in PyTorch's f32 as in flowrun's); the step is PyTorch's optimizer
    on flowrun's gradients; the end-to-end update (PyTorch's own gradients) is reported."""
    cfg = CONFIGS[name]
    dump, ckpt = run_flowrun(flowrun, name, cfg, work)
    dump["classes"] = num_classes(cfg, dump)
    flow_after = {**ckpt["params"], **{k: v for k, v in ckpt["state"].items() if not k.startswith("opt/")}}
    loss64, g64, own64 = torch_step(name, cfg, dump, torch.float64)
    loss32, g32, _ = torch_step(name, cfg, dump, torch.float32)
    _, _, step64 = torch_step(name, cfg, dump, torch.float64, flowrun_grads=True)
    e64 = {n: rel(dump["grads"][n], g) for n, g in g64.items()}
    e32 = {n: rel(dump["grads"][n], g) for n, g in g32.items()}
    best = {n: min(e64[n], e32[n]) for n in e64}
    r = {"model": name, "params": sum(v.size for v in dump["params"].values()), "loss": dump["loss"],
         "loss_err": abs(dump["loss"] - loss64) / abs(loss64), "loss_err32": abs(dump["loss"] - loss32) / abs(loss32)}
    r["grad64"], r["grad64_at"] = worst(e64)
    r["grad32"], r["grad32_at"] = worst(e32)
    r["grad"], r["grad_at"] = worst(best)
    r["update"], r["update_at"] = worst({n: rel(flow_after[n], a) for n, a in step64.items()})
    r["e2e"], r["e2e_at"] = worst({n: rel(flow_after[n], a) for n, a in own64.items()})
    return r


def passed(r):
    return min(r["loss_err"], r["loss_err32"]) <= TOL and r["grad"] <= TOL and r["update"] <= TOL


def table(rows):
    out = ["| model | params | loss | loss rel err (f64 / f32) | worst grad rel err vs f64 (tensor) | "
           "vs f32 (tensor) | worst step err (tensor) | end-to-end update err (tensor) | |",
           "|---|---:|---:|---:|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['params']:,} | {r['loss']:.6f} | {r['loss_err']:.1e} / {r['loss_err32']:.1e} | "
                   f"{r['grad64']:.1e} (`{r['grad64_at']}`) | {r['grad32']:.1e} (`{r['grad32_at']}`) | "
                   f"{r['update']:.1e} (`{r['update_at']}`) | {r['e2e']:.1e} (`{r['e2e_at']}`) | "
                   f"{'pass' if passed(r) else 'FAIL'} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flowrun", default=os.path.join(ROOT, "build", "apps", "flowrun"))
    ap.add_argument("--models", default=",".join(TWINS), help=f"comma-separated, of {', '.join(TWINS)}")
    ap.add_argument("--keep", metavar="DIR", help="keep the configs, dumps and runs here (default: a temporary "
                    "directory, removed)")
    ap.add_argument("--names", metavar="MODEL", help="print MODEL's flowrun name -> PyTorch tensor map and exit")
    ap.add_argument("--threads", type=int, default=2, help="PyTorch's threads (default 2)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    models = [m for m in a.models.split(",") if m]
    unknown = [m for m in models + ([a.names] if a.names else []) if m not in TWINS]
    if unknown:
        ap.error(f"unknown model {', '.join(unknown)}; the models are {', '.join(TWINS)}")
    if a.names:
        return print_names(a.names)
    if not os.access(a.flowrun, os.X_OK):
        ap.error(f"{a.flowrun} is not an executable flowrun (build it, or pass --flowrun)")
    work = a.keep or tempfile.mkdtemp(prefix="flowrun-parity.")
    rows = []
    try:
        for m in models:
            r = check_model(m, a.flowrun, os.path.join(work, m))
            rows.append(r)
            print(f"{m}: {'pass' if passed(r) else 'FAIL'} (loss {r['loss_err']:.1e}, gradients {r['grad']:.1e} "
                  f"at {r['grad_at']}, step {r['update']:.1e} at {r['update_at']})", flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(rows))
    return 0 if all(passed(r) for r in rows) else 1


def print_names(name):
    cfg = CONFIGS[name]
    spec = {"text": name in ("gpt",), "shape": [3, 32, 32] if name == "resnet" else [1, 28, 28],
            "features": 784, "seq_len": cfg["data"].get("seq_len", 0), "classes": 256 if name == "gpt" else 10}
    model = TWINS[name](cfg, spec)
    where = {id(t): n for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    for n, t in model.flowrun_names().items():
        print(f"{n:40s} {where[id(t)]:40s} {tuple(t.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

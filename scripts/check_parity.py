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
    # Grouped-query attention (4 query heads over 2 key/value heads), rotary positions (Llama 3's theta),
    # SwiGLU, RMSNorm, no biases, untied head; AdamW.
    "llama": {
        "model": {"zoo": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 32, "ffn": 64,
                  "rope_theta": 500000.0},
        "data": {"dataset": "kjv", "seq_len": 32, "eval_batches": 1},
        "train": {"batch_size": 4},
        "optimizer": {"type": "adamw", "lr": 3e-3, "weight_decay": 0.1},
    },
    # Patches of 7 (16 of them and the class token), bidirectional attention, exact GELU; AdamW decaying
    # the 1-d parameters too (optimizer.decay_1d).
    "vit": {
        "model": {"zoo": "vit", "patch": 7, "n_layer": 2, "n_head": 2, "d_model": 32, "ffn": 64},
        "data": {"dataset": "fashion_mnist", "eval_batches": 1},
        "train": {"batch_size": 16},
        "optimizer": {"type": "adamw", "lr": 1e-3, "weight_decay": 0.05, "decay_1d": True},
    },
    # Masked bytes (15%, 80/10/10, flowrun's draw: the dump's masked ids and labels), post-LN encoder, MLM
    # head tied to the word embedding with its own bias; SGD with momentum; 2 micro-batches of 4 (the loss
    # is the mean over every masked position of the step, whichever micro-batch holds it).
    "bert": {
        "model": {"zoo": "bert", "n_layer": 2, "n_head": 2, "d_model": 32, "ffn": 64},
        "data": {"dataset": "kjv", "seq_len": 32, "eval_batches": 1},
        "train": {"batch_size": 8, "micro_batch_size": 4},
        "optimizer": {"type": "sgd", "lr": 0.1, "momentum": 0.9},
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


class Block(nn.Module):
    """`transformer_block` (lib/nn/layers.cc) with its options: pre-LN `x + attn(ln1(x))`, `x + mlp(ln2(x))`
    or, with post_norm (BERT), `ln1(x + attn(x))`, `ln2(x + mlp(x))`. Norms `ln1`, `ln2` (LayerNorm: gamma,
    beta; RMSNorm: gamma). Attention: one fused `attn/qkv` linear (q | k | v along its output, GPT-2) or
    `attn/q`, `attn/k`, `attn/v` (Llama, BERT), then heads, optional rotary positions on q and k, k/v heads
    repeated for grouped-query attention, scaled dot-product attention (causal or not), `attn/proj`. MLP:
    `mlp/fc` -> GELU (tanh or erf) -> `mlp/proj`, or SwiGLU `mlp/down(silu(mlp/gate(x)) * mlp/up(x))`."""

    def __init__(self, d, heads, hidden, kv_heads=None, norm="layernorm", eps=1e-5, mlp="gelu_tanh",
                 bias=True, rope=False, theta=10000.0, qkv="fused", causal=True, post_norm=False):
        super().__init__()
        self.heads, self.kv = heads, kv_heads or heads
        self.rope, self.theta, self.causal, self.post = rope, theta, causal, post_norm
        self.mlp, self.fused = mlp, qkv == "fused"
        self.rms = norm == "rmsnorm"
        make_norm = (lambda: RMSNorm(d, eps)) if self.rms else (lambda: nn.LayerNorm(d, eps=eps))
        self.ln1, self.ln2 = make_norm(), make_norm()
        kd = self.kv * (d // heads)
        if self.fused:
            self.qkv = nn.Linear(d, d + 2 * kd, bias=bias)
        else:
            self.q = nn.Linear(d, d, bias=bias)
            self.k, self.v = nn.Linear(d, kd, bias=bias), nn.Linear(d, kd, bias=bias)
        self.proj = nn.Linear(d, d, bias=bias)
        if mlp == "swiglu":
            self.gate, self.up, self.down = (nn.Linear(d, hidden, bias=bias), nn.Linear(d, hidden, bias=bias),
                                             nn.Linear(hidden, d, bias=bias))
        else:
            self.fc, self.fc_proj = nn.Linear(d, hidden, bias=bias), nn.Linear(hidden, d, bias=bias)

    def attention(self, x):
        B, T, C = x.shape
        D = C // self.heads
        if self.fused:
            q, k, v = self.qkv(x).split([C, self.kv * D, self.kv * D], dim=2)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q = q.view(B, T, self.heads, D).transpose(1, 2)
        k, v = (t.view(B, T, self.kv, D).transpose(1, 2) for t in (k, v))
        if self.rope:
            q, k = rope(q, self.theta), rope(k, self.theta)
        if self.kv < self.heads:  # Hugging Face's repeat_kv: query head h reads k/v head h // (H / KV)
            g = self.heads // self.kv
            k, v = (t[:, :, None].expand(B, self.kv, g, T, D).reshape(B, self.heads, T, D) for t in (k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(a.transpose(1, 2).reshape(B, T, C))

    def feed_forward(self, x):
        if self.mlp == "swiglu":
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.fc_proj(F.gelu(self.fc(x), approximate="tanh" if self.mlp == "gelu_tanh" else "none"))

    def forward(self, x):
        if self.post:
            x = self.ln1(x + self.attention(x))
            return self.ln2(x + self.feed_forward(x))
        x = x + self.attention(self.ln1(x))
        return x + self.feed_forward(self.ln2(x))

    def flowrun_names(self, p, m):
        for name, mod in (("ln1", self.ln1), ("ln2", self.ln2)):
            norm_names(m, f"{p}/{name}", mod)
        lin = [("attn/qkv", "qkv")] if self.fused else [("attn/q", "q"), ("attn/k", "k"), ("attn/v", "v")]
        lin += [("attn/proj", "proj")]
        lin += ([("mlp/gate", "gate"), ("mlp/up", "up"), ("mlp/down", "down")] if self.mlp == "swiglu"
                else [("mlp/fc", "fc"), ("mlp/proj", "fc_proj")])
        for name, attr in lin:
            linear_names(m, f"{p}/{name}", getattr(self, attr))


class RMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm: x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, d, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, theta):
    """Hugging Face Llama's rotary embedding (rotate_half): inv_freq and the angles in float32 as
    LlamaRotaryEmbedding forms them, cos and sin in x's dtype."""
    T, D = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1).to(x.dtype)
    cos, sin = emb.cos(), emb.sin()
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def norm_names(m, p, mod):
    m[f"{p}/gamma"] = mod.weight
    if isinstance(mod, nn.LayerNorm):
        m[f"{p}/beta"] = mod.bias


def linear_names(m, p, lin):
    m[f"{p}/w"] = lin.weight
    if lin.bias is not None:
        m[f"{p}/b"] = lin.bias


class GPT(nn.Module):
    """models/gpt.yaml: `wte` token and `wpe` position embeddings, `blocks.<i>` (pre-LN, fused qkv, causal,
    GELU tanh), `ln_f`, logits = h @ wte^T (the tied head has no parameter of its own: wte's gradient sums
    both uses)."""

    def __init__(self, cfg, spec):
        super().__init__()
        d, vocab = param(cfg, "d_model", 256), param(cfg, "vocab_size", spec["classes"])
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(spec["seq_len"], d)
        self.blocks = nn.ModuleList(Block(d, param(cfg, "n_head", 4), 4 * d) for _ in range(param(cfg, "n_layer", 4)))
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
        norm_names(m, "ln_f", self.ln_f)
        return m


class Llama(nn.Module):
    """models/llama.yaml, Hugging Face LlamaForCausalLM's math: `embed_tokens`, `layers.<i>` (RMSNorm
    pre-norm `ln1` = input_layernorm, `ln2` = post_attention_layernorm; `attn/q`, `attn/k`, `attn/v`,
    `attn/proj` = q_proj, k_proj, v_proj, o_proj; rotary positions; grouped-query attention; SwiGLU
    `mlp/gate`, `mlp/up`, `mlp/down` = gate_proj, up_proj, down_proj; no biases), final `norm`, `lm_head`
    (or, with tie_head, logits = h @ embed_tokens^T)."""

    def __init__(self, cfg, spec):
        super().__init__()
        d, vocab = param(cfg, "d_model", 256), param(cfg, "vocab_size", spec["classes"])
        heads = param(cfg, "n_head", 4)
        ffn = param(cfg, "ffn", (8 * d // 3 + 63) // 64 * 64)
        eps = param(cfg, "norm_eps", 1e-5)
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(
            Block(d, heads, ffn, kv_heads=param(cfg, "n_kv_head", heads), norm="rmsnorm", eps=eps, mlp="swiglu",
                  bias=False, rope=True, theta=param(cfg, "rope_theta", 10000.0), qkv="separate")
            for _ in range(param(cfg, "n_layer", 4)))
        self.norm = RMSNorm(d, eps)
        self.tied = param(cfg, "tie_head", False)
        self.lm_head = None if self.tied else nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        h = self.embed_tokens(idx)
        for b in self.layers:
            h = b(h)
        h = self.norm(h)
        return h @ self.embed_tokens.weight.t() if self.tied else self.lm_head(h)

    def flowrun_names(self):
        m = {"embed_tokens/w": self.embed_tokens.weight}
        for i, b in enumerate(self.layers):
            b.flowrun_names(f"layers.{i}", m)
        m["norm/gamma"] = self.norm.weight
        if not self.tied:
            m["lm_head/w"] = self.lm_head.weight
        return m


class ViT(nn.Module):
    """models/vit.yaml: `patch_embed` (conv, kernel = stride = patch; patches row-major), `cls_token`
    prepended, `pos_embed` added, `blocks.<i>` (pre-LN, fused qkv with biases, bidirectional, exact GELU),
    final `norm`, `head` linear on the class token."""

    def __init__(self, cfg, spec):
        super().__init__()
        d, p = param(cfg, "d_model", 128), param(cfg, "patch", 7)
        c, h, w = spec["shape"]
        eps = param(cfg, "norm_eps", 1e-6)
        self.patch_embed = nn.Conv2d(c, d, p, stride=p)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.zeros((h // p) * (w // p) + 1, d))
        self.blocks = nn.ModuleList(
            Block(d, param(cfg, "n_head", 4), param(cfg, "ffn", 4 * d), eps=eps, mlp="gelu", causal=False)
            for _ in range(param(cfg, "n_layer", 4)))
        self.norm = nn.LayerNorm(d, eps=eps)
        self.head = nn.Linear(d, spec["classes"])

    def forward(self, x):
        h = self.patch_embed(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls_token.expand(h.shape[0], 1, -1), h], dim=1) + self.pos_embed
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h)[:, 0])

    def flowrun_names(self):
        m = {"patch_embed/w": self.patch_embed.weight, "patch_embed/b": self.patch_embed.bias,
             "cls_token/w": self.cls_token, "pos_embed/w": self.pos_embed}
        for i, b in enumerate(self.blocks):
            b.flowrun_names(f"blocks.{i}", m)
        norm_names(m, "norm", self.norm)
        linear_names(m, "head", self.head)
        return m


class Bert(nn.Module):
    """models/bert.yaml, Hugging Face BertForMaskedLM's math: `word_embeddings`, `position_embeddings`,
    `token_type_embeddings` (row 0: one segment), `emb_ln` (embeddings.LayerNorm), `layer.<i>` post-LN
    blocks (`attn/q`, `attn/k`, `attn/v` = attention.self.query, key, value; `attn/proj` =
    attention.output.dense; `ln1` = attention.output.LayerNorm; `mlp/fc` = intermediate.dense; `mlp/proj` =
    output.dense; `ln2` = output.LayerNorm; erf GELU; bidirectional), the MLM head `transform` +
    GELU + `transform_ln` (cls.predictions.transform), decoder tied to word_embeddings with bias `decoder/b`.
    Its input is flowrun's masked ids and its targets the masking's labels, both from the dump."""

    def __init__(self, cfg, spec):
        super().__init__()
        d, eps = param(cfg, "d_model", 256), param(cfg, "norm_eps", 1e-12)
        # models/bert.yaml's default: the data's tokens and [MASK], padded to a multiple of 8.
        vocab = param(cfg, "vocab_size", (spec["classes"] + 1 + 7) // 8 * 8)
        self.word_embeddings = nn.Embedding(vocab, d)
        self.position_embeddings = nn.Embedding(param(cfg, "max_len", spec["seq_len"]), d)
        self.token_type_embeddings = nn.Embedding(2, d)
        self.emb_ln = nn.LayerNorm(d, eps=eps)
        self.layer = nn.ModuleList(
            Block(d, param(cfg, "n_head", 4), param(cfg, "ffn", 4 * d), eps=eps, mlp="gelu", qkv="separate",
                  causal=False, post_norm=True)
            for _ in range(param(cfg, "n_layer", 4)))
        self.transform = nn.Linear(d, d)
        self.transform_ln = nn.LayerNorm(d, eps=eps)
        self.decoder_bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, ids):
        T = ids.shape[1]
        h = self.word_embeddings(ids) + self.position_embeddings.weight[:T] + self.token_type_embeddings.weight[0]
        h = self.emb_ln(h)
        for b in self.layer:
            h = b(h)
        h = self.transform_ln(F.gelu(self.transform(h)))
        return h @ self.word_embeddings.weight.t() + self.decoder_bias

    def flowrun_names(self):
        m = {"word_embeddings/w": self.word_embeddings.weight, "position_embeddings/w": self.position_embeddings.weight,
             "token_type_embeddings/w": self.token_type_embeddings.weight}
        norm_names(m, "emb_ln", self.emb_ln)
        for i, b in enumerate(self.layer):
            b.flowrun_names(f"layer.{i}", m)
        linear_names(m, "transform", self.transform)
        norm_names(m, "transform_ln", self.transform_ln)
        m["decoder/b"] = self.decoder_bias
        return m


TWINS = {"mlp": MLP, "cnn": CNN, "resnet": ResNet, "gpt": GPT, "llama": Llama, "vit": ViT, "bert": Bert}


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
    """The data's classes: the image models' `head` rows, or for text the vocabulary of flowrun's byte-level
    text datasets (256)."""
    head = dump["params"].get("head/w")
    return head.shape[0] if head is not None else 256


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


FLOOR = 1e-6


def rel(a, b, floor):
    """max|a - b| / max(max|b|, floor) over a tensor. The floor is FLOOR times the model's largest value of
    the kind (gradient, weight): a tensor that is zero in exact arithmetic (BERT's key bias gets no gradient:
    softmax ignores a shift shared by every key) holds rounding noise on both sides, which the floor
    measures against the model's scale rather than against itself."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = np.max(np.abs(a - b)) if a.size else 0.0
    s = max(np.max(np.abs(b)) if b.size else 0.0, floor)
    return d / s if s > 0 else d


def floor_of(tensors):
    return FLOOR * max((np.max(np.abs(t)) for t in tensors.values() if t.size), default=0.0)


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
    if dump["mlm"]:
        # BERT: the model reads flowrun's masked ids and is scored on the masking's labels.
        nodes = sorted({k.rsplit("/", 1)[0] for k in dump["mlm"]})
        if len(nodes) != 1:
            raise RuntimeError(f"{name}: expected one masking node in the dump, got {nodes}")
        x = torch.from_numpy(dump["mlm"][nodes[0] + "/ids"])
        y = torch.from_numpy(dump["mlm"][nodes[0] + "/labels"]).long()
    acc = dump["accumulation"]
    # Under accumulation flowrun's loss is the mean of the micro-batches' mean losses (and BatchNorm sees
    # each micro-batch alone): the same here, one micro-batch after the other. BERT's micro-batches divide
    # their sums by the whole step's count of masked positions (mlm_mask's count), so its loss is the mean
    # over every masked position of the step, as one batch's would be.
    loss = 0
    reduction = "sum" if dump["mlm"] else "mean"
    for xs, ys in zip(x.chunk(acc), y.chunk(acc)):
        logits = model(xs)
        loss = loss + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ys.reshape(-1), ignore_index=-100,
                                      reduction=reduction)
    loss = loss / (max(int((y != -100).sum()), 1) if dump["mlm"] else acc)
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
    either within TOL, tensor by tensor, or, for a gradient whose f32 value is ill-conditioned (e.g. under
    cancellation: PyTorch's own f32 is far from its f64), where flowrun is at most twice as far from float64
    as PyTorch's float32 (`ill`, listed); the step is PyTorch's optimizer on flowrun's gradients; the
    end-to-end update (PyTorch's own gradients) is reported."""
    cfg = CONFIGS[name]
    dump, ckpt = run_flowrun(flowrun, name, cfg, work)
    dump["classes"] = num_classes(cfg, dump)
    flow_after = {**ckpt["params"], **{k: v for k, v in ckpt["state"].items() if not k.startswith("opt/")}}
    loss64, g64, own64 = torch_step(name, cfg, dump, torch.float64)
    loss32, g32, _ = torch_step(name, cfg, dump, torch.float32)
    _, _, step64 = torch_step(name, cfg, dump, torch.float64, flowrun_grads=True)
    gfloor, wfloor = floor_of(g64), floor_of(own64)
    e64 = {n: rel(dump["grads"][n], g, gfloor) for n, g in g64.items()}
    e32 = {n: rel(dump["grads"][n], g, gfloor) for n, g in g32.items()}
    best = {n: min(e64[n], e32[n]) for n in e64}
    # PyTorch float32's own distance from float64: an ill-conditioned gradient (terms that cancel) is that far
    # in any f32 program, and two of them need not round alike.
    own32 = {n: rel(g32[n], g, gfloor) for n, g in g64.items()}
    r_ill = {n: own32[n] for n in e64 if best[n] > TOL and e64[n] <= 2 * own32[n]}
    r = {"model": name, "params": sum(v.size for v in dump["params"].values()), "loss": dump["loss"],
         "loss_err": abs(dump["loss"] - loss64) / abs(loss64), "loss_err32": abs(dump["loss"] - loss32) / abs(loss32)}
    r["grad64"], r["grad64_at"] = worst(e64)
    r["grad32"], r["grad32_at"] = worst(e32)
    r["grad"], r["grad_at"] = worst({n: e for n, e in best.items() if n not in r_ill} or {"-": 0.0})
    r["ill"], r["e64"] = r_ill, e64
    r["update"], r["update_at"] = worst({n: rel(flow_after[n], a, wfloor) for n, a in step64.items()})
    r["e2e"], r["e2e_at"] = worst({n: rel(flow_after[n], a, wfloor) for n, a in own64.items()})
    # Gradients that vanish in exact arithmetic, and flowrun's largest value in them.
    r["zero_grads"] = {n: float(np.max(np.abs(dump["grads"][n]))) for n, g in g64.items()
                       if g.size and np.max(np.abs(g)) < gfloor}
    return r


def passed(r):
    return min(r["loss_err"], r["loss_err32"]) <= TOL and r["grad"] <= TOL and r["update"] <= TOL


def table(rows):
    out = ["| model | params | loss | loss rel err (f64 / f32) | worst grad rel err vs f64 (tensor) | "
           "vs f32 (tensor) | worst step err (tensor) | end-to-end update err (tensor) | |",
           "|---|---:|---:|---:|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['params']:,} | {r['loss']:.6f} | "
                   f"{r['loss_err']:.1e} / {r['loss_err32']:.1e} | "
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
    rows, failed = [], []
    try:
        for m in models:
            try:
                r = check_model(m, a.flowrun, os.path.join(work, m))
            except RuntimeError as e:  # flowrun refused or failed the config, or the twin does not fit
                print(f"{m}: ERROR: {e}", file=sys.stderr, flush=True)
                failed.append(m)
                continue
            rows.append(r)
            print(f"{m}: {'pass' if passed(r) else 'FAIL'} (loss {r['loss_err']:.1e}, gradients {r['grad']:.1e} "
                  f"at {r['grad_at']}, step {r['update']:.1e} at {r['update_at']})", flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(rows))
    for r in rows:
        if r["zero_grads"]:
            print(f"\n{r['model']}: gradients below {FLOOR:g} of the model's largest in float64 (zero in exact "
                  "arithmetic), flowrun's largest value in each: " +
                  ", ".join(f"`{n}` {v:.1e}" for n, v in r["zero_grads"].items()))
        if r["ill"]:
            print(f"\n{r['model']}: ill-conditioned in float32, judged against PyTorch float32's own distance "
                  "from float64 (flowrun's / PyTorch's): " +
                  ", ".join(f"`{n}` {r['e64'][n]:.1e} / {v:.1e}" for n, v in r["ill"].items()))
    if failed:
        print(f"\nnot checked (errors above): {', '.join(failed)}")
    return 0 if not failed and all(passed(r) for r in rows) else 1


def print_names(name):
    """flowrun name, PyTorch name in the twin, shape: for the config above."""
    cfg = CONFIGS[name]
    text = cfg["data"]["dataset"] == "kjv"
    shape = [3, 32, 32] if cfg["data"]["dataset"] == "fashion_mnist_3x32" else [1, 28, 28]
    spec = {"text": text, "shape": shape, "features": int(np.prod(shape)), "seq_len": cfg["data"].get("seq_len", 0),
            "classes": 256 if text else 10}
    model = TWINS[name](cfg, spec)
    where = {id(t): n for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    for n, t in model.flowrun_names().items():
        print(f"{n:40s} {where[id(t)]:40s} {tuple(t.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

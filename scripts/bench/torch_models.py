"""PyTorch twins of the four bench runs (configs/bench/*.yaml): models, optimizers and data.

Each architecture has flowrun's zoo parameter shapes (models/{mlp,cnn,resnet,gpt}.yaml) and its
initialisation scheme (lib/nn/init.cc: `pytorch` = PyTorch's defaults, `kaiming` convs N(0, sqrt(2/fan_out)),
`gpt2` N(0, 0.02) with residual projections scaled by 1/sqrt(2 n_layer)); the optimizer and its
hyper-parameters are those of the matching config, including flowrun's default of no weight decay on 1-d
parameters (optimizer.decay_1d: false). Data comes from the HDF5 files flowrun itself trains on, held whole
in memory as bytes and converted batch by batch, as flowrun's loader does.
"""
import math
import os

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_common import read_images

# --- models -----------------------------------------------------------------------------------------


def mlp():
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 10),
    )


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )


class BasicBlock(nn.Module):
    """relu(bn(conv(relu(bn(conv(x))))) + shortcut(x)); a 1x1 conv + BN shortcut where the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR ResNet (He et al. 2016, 4.2) with basic blocks: depth 6n+2, widths w, 2w, 4w."""

    def __init__(self, depth=20, width=16, in_channels=3, classes=10):
        super().__init__()
        n = (depth - 2) // 6
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        blocks, cin = [], width
        for s in range(3):
            cout = width * 2**s
            for i in range(n):
                blocks.append(BasicBlock(cin, cout, 2 if s > 0 and i == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)
        # flowrun's `kaiming` scheme: convs N(0, sqrt(2 / fan_out)); linear layers and BN keep PyTorch's defaults.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        h = self.blocks(self.stem(x))
        return self.head(h.mean(dim=(2, 3)))


class Block(nn.Module):
    """GPT-2 pre-LN block: x + attn(ln1(x)), then x + mlp(ln2(x)), GELU (tanh approximation)."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """Byte-level GPT-2: token + learned position embeddings, pre-LN blocks, final LN, head tied to wte."""

    def __init__(self, vocab=256, seq_len=128, n_layer=4, n_head=4, d_model=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.Sequential(*[Block(d_model, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model)
        # flowrun's `gpt2` scheme.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias") and "ln" not in name:
                nn.init.zeros_(p)
        self.register_buffer("pos", torch.arange(seq_len), persistent=False)

    def forward(self, idx):
        h = self.blocks(self.wte(idx) + self.wpe(self.pos[: idx.shape[1]]))
        return self.ln_f(h) @ self.wte.weight.t()


# --- bench definitions ------------------------------------------------------------------------------


def param_groups(model, weight_decay):
    """Weight decay on parameters of 2 or more dimensions only (flowrun's optimizer.decay_1d: false)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


# name -> (model factory, batch, dataset, optimizer factory); keep in step with configs/bench/*.yaml.
BENCH = {
    "mlp": (mlp, 128, "fashion",
            lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)),
    "cnn": (cnn, 64, "fashion",
            lambda m: torch.optim.SGD(m.parameters(), lr=0.02, momentum=0.9)),
    "resnet": (ResNet, 64, "fashion32",
               lambda m: torch.optim.SGD(param_groups(m, 5e-4), lr=0.1, momentum=0.9)),
    "gpt-tiny": (GPT, 16, "kjv",
                 lambda m: torch.optim.AdamW(param_groups(m, 0.1), lr=1e-3, betas=(0.9, 0.95), eps=1e-8)),
}
SEQ_LEN = 128


def build(name, seed=1):
    """(model, optimizer, batch size, dataset kind) of bench `name`."""
    factory, batch, data, make_opt = BENCH[name]
    torch.manual_seed(seed)
    model = factory()
    return model, make_opt(model), batch, data


# --- data -------------------------------------------------------------------------------------------
# Like flowrun's loader, the whole file stays in memory as bytes and each batch is gathered and converted
# (images: (x / 255 - mean) / std per channel; text: bytes -> i64 ids) when it is drawn.


class Images:
    """One split of an image HDF5 file: u8 (N, C, H, W) pixels, i64 labels, per-channel mean and std."""

    def __init__(self, x_u8, y, mean, std):
        self.x = torch.from_numpy(x_u8 if x_u8.ndim == 4 else x_u8[:, None])
        self.y = torch.from_numpy(y.astype(np.int64))
        c = self.x.shape[1]
        self.mean = torch.tensor(np.broadcast_to(mean, (c,)), dtype=torch.float32).view(1, c, 1, 1)
        self.std = torch.tensor(np.broadcast_to(std, (c,)), dtype=torch.float32).view(1, c, 1, 1)

    def __len__(self):
        return len(self.y)

    def gather(self, idx):
        x = self.x.index_select(0, idx).float().div_(255.0).sub_(self.mean).div_(self.std)
        return x, self.y.index_select(0, idx)


def load_images(path):
    """(train, test) of an image HDF5 file, normalised as flowrun's loader does (bench_common.read_images)."""
    xtr, ytr, xte, yte, mean, std = read_images(path)
    return Images(xtr, ytr, mean, std), Images(xte, yte, mean, std)


class Text:
    """One split of a byte stream as flowrun samples it: sample i is input bytes [iT, iT+T) and targets
    [iT+1, iT+T+1), (bytes - 1) // T samples."""

    def __init__(self, stream_u8, seq_len):
        t = torch.from_numpy(stream_u8)
        self.n = (len(t) - 1) // seq_len
        self.x = t[: self.n * seq_len].view(self.n, seq_len)
        self.y = t[1: self.n * seq_len + 1].view(self.n, seq_len)

    def __len__(self):
        return self.n

    def gather(self, idx):
        return self.x.index_select(0, idx).long(), self.y.index_select(0, idx).long()


def load_text(path, seq_len=SEQ_LEN):
    """(train, val) of flowrun's KJV HDF5 file (/train and /val byte streams)."""
    with h5py.File(path, "r") as f:
        return Text(f["train"][...], seq_len), Text(f["val"][...], seq_len)


def data_file(data_dir, kind):
    return os.path.join(data_dir, {"fashion": "fashion_mnist.h5", "fashion32": "fashion_mnist_3x32.h5",
                                   "kjv": "kjv.h5"}[kind])


def load(data_dir, kind):
    """(train, val) splits of bench dataset `kind`."""
    path = data_file(data_dir, kind)
    return load_text(path) if kind == "kjv" else load_images(path)


class Batches:
    """Training batches as flowrun's loader draws them: a fresh permutation per epoch from (seed, epoch),
    floor(N / batch) full batches per epoch."""

    def __init__(self, split, batch, seed=1, shuffle=True):
        self.split, self.batch, self.seed, self.shuffle = split, batch, seed, shuffle
        self.epoch, self.index, self.order = -1, 0, None
        self.per_epoch = len(split) // batch

    def _new_epoch(self):
        self.epoch += 1
        self.index = 0
        g = torch.Generator().manual_seed(self.seed * 1000003 + self.epoch)
        n = len(self.split)
        self.order = torch.randperm(n, generator=g) if self.shuffle else torch.arange(n)

    def next(self):
        if self.order is None or self.index == self.per_epoch:
            self._new_epoch()
        idx = self.order[self.index * self.batch: (self.index + 1) * self.batch]
        self.index += 1
        return self.split.gather(idx)


def val_batches(split, batch, count):
    """The first `count` validation batches in order (all when count is 0), the last one possibly short:
    flowrun pads it and weights each batch's mean loss by its real rows, which gives the same mean."""
    n = len(split)
    total = (n + batch - 1) // batch if count == 0 else min(count, (n + batch - 1) // batch)
    return [split.gather(torch.arange(b * batch, min((b + 1) * batch, n))) for b in range(total)]


def loss_of(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

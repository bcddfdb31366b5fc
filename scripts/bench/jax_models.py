"""JAX twins of the four bench runs (configs/bench/*.yaml): models, optimizers and data, in plain jax + optax.

They follow the PyTorch twins in torch_models.py: the same architectures and parameter counts, the same
initialisation schemes (`pytorch` defaults, `kaiming` convs, `gpt2`; drawn with numpy, so not the same
numbers), the same optax optimizers and hyper-parameters (weight decay on parameters of 2 or more
dimensions only), the same data files and batch sampling (with numpy's permutation). Differences in form
only: images are NHWC and conv kernels HWIO (XLA's CPU convolutions are NHWC; the batch is transposed when
it is gathered, outside the timed step), so the CNN flattens its features in (h, w, c) order, and linear
weights are stored (in, out).

A model is a pair of pure functions: `init(rng) -> (params, state)` and `apply(params, state, x, cdt) ->
(logits, new_state)`, where `state` holds batchnorm running statistics (empty for models without batchnorm)
and `cdt` is the compute dtype of matmuls and convolutions. With cdt = bfloat16 the operands of every
matmul and convolution are cast to bf16 and its result stays bf16, as under torch.autocast("cpu", bfloat16);
layer norm, batchnorm statistics, softmax and the loss compute in fp32, the parameters stay fp32.
"""
import functools
import math
import os

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench_common import read_images

F32 = jnp.float32

# --- initialisers (numpy, so that building a model compiles nothing) ---------------------------------


def _uniform(rng, shape, bound):
    return rng.uniform(-bound, bound, shape).astype(np.float32)


def _normal(rng, shape, std):
    return rng.normal(0.0, std, shape).astype(np.float32)


def linear_init(rng, fan_in, fan_out, bias=True):
    """PyTorch's nn.Linear default: weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)
    p = {"w": _uniform(rng, (fan_in, fan_out), bound)}
    if bias:
        p["b"] = _uniform(rng, (fan_out,), bound)
    return p


def conv_init(rng, k, cin, cout, bias=True, kaiming=False):
    """PyTorch's nn.Conv2d default (U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = cin k k), or with kaiming
    flowrun's `kaiming` scheme (kaiming_normal_, mode fan_out, relu: N(0, sqrt(2 / (cout k k))))."""
    if kaiming:
        p = {"w": _normal(rng, (k, k, cin, cout), math.sqrt(2.0 / (cout * k * k)))}
    else:
        p = {"w": _uniform(rng, (k, k, cin, cout), 1.0 / math.sqrt(cin * k * k))}
    if bias:
        p["b"] = _uniform(rng, (cout,), 1.0 / math.sqrt(cin * k * k))
    return p


# --- layers -----------------------------------------------------------------------------------------


def linear(p, x, cdt):
    y = jnp.dot(x.astype(cdt), p["w"].astype(cdt))
    return y + p["b"].astype(cdt) if "b" in p else y


def conv(p, x, cdt, stride=1, padding=1):
    y = jax.lax.conv_general_dilated(x.astype(cdt), p["w"].astype(cdt), (stride, stride),
                                     [(padding, padding)] * 2, dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + p["b"].astype(cdt) if "b" in p else y


def max_pool2(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def layer_norm(p, x, eps=1e-5):
    xf = x.astype(F32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + eps) * p["g"] + p["b"]).astype(x.dtype)


def bn_init(c):
    return {"g": np.ones(c, np.float32), "b": np.zeros(c, np.float32)}, \
           {"mean": np.zeros(c, np.float32), "var": np.ones(c, np.float32)}


def batch_norm(p, s, x, momentum=0.1, eps=1e-5):
    """Training-mode BatchNorm2d over N, H, W: normalises with the batch's biased variance and updates the
    running mean and the running (unbiased) variance with momentum 0.1, as PyTorch does."""
    xf = x.astype(F32)
    mean = xf.mean((0, 1, 2))
    var = jnp.square(xf - mean).mean((0, 1, 2))
    n = x.size // x.shape[-1]
    new_s = {"mean": (1 - momentum) * s["mean"] + momentum * jax.lax.stop_gradient(mean),
             "var": (1 - momentum) * s["var"] + momentum * jax.lax.stop_gradient(var) * n / (n - 1)}
    y = (xf - mean) * jax.lax.rsqrt(var + eps) * p["g"] + p["b"]
    return y.astype(x.dtype), new_s


# --- models -----------------------------------------------------------------------------------------


def mlp():
    def init(rng):
        return {"fc1": linear_init(rng, 784, 512), "fc2": linear_init(rng, 512, 512),
                "fc3": linear_init(rng, 512, 10)}, {}

    def apply(p, s, x, cdt):
        h = x.reshape(x.shape[0], -1)
        h = jax.nn.relu(linear(p["fc1"], h, cdt))
        h = jax.nn.relu(linear(p["fc2"], h, cdt))
        return linear(p["fc3"], h, cdt), s

    return init, apply


def cnn():
    def init(rng):
        return {"conv1": conv_init(rng, 3, 1, 32), "conv2": conv_init(rng, 3, 32, 64),
                "fc1": linear_init(rng, 64 * 7 * 7, 128), "fc2": linear_init(rng, 128, 10)}, {}

    def apply(p, s, x, cdt):
        h = max_pool2(jax.nn.relu(conv(p["conv1"], x, cdt)))
        h = max_pool2(jax.nn.relu(conv(p["conv2"], h, cdt)))
        h = jax.nn.relu(linear(p["fc1"], h.reshape(h.shape[0], -1), cdt))
        return linear(p["fc2"], h, cdt), s

    return init, apply


def resnet(depth=20, width=16, in_channels=3, classes=10):
    """CIFAR ResNet (He et al. 2016, 4.2) with basic blocks: depth 6n+2, widths w, 2w, 4w; a block is
    relu(bn(conv(relu(bn(conv(x))))) + shortcut(x)), a 1x1 conv + BN shortcut where the shape changes."""
    n = (depth - 2) // 6
    plan, cin = [], width  # (cin, cout, stride) of each block
    for stage in range(3):
        cout = width * 2**stage
        for i in range(n):
            plan.append((cin, cout, 2 if stage > 0 and i == 0 else 1))
            cin = cout

    def init(rng):
        p, s = {"stem": conv_init(rng, 3, in_channels, width, bias=False, kaiming=True)}, {}
        p["stem_bn"], s["stem_bn"] = bn_init(width)
        blocks, block_state = [], []
        for cin, cout, stride in plan:
            bp, bs = {"conv1": conv_init(rng, 3, cin, cout, bias=False, kaiming=True),
                      "conv2": conv_init(rng, 3, cout, cout, bias=False, kaiming=True)}, {}
            bp["bn1"], bs["bn1"] = bn_init(cout)
            bp["bn2"], bs["bn2"] = bn_init(cout)
            if stride != 1 or cin != cout:
                bp["short"] = conv_init(rng, 1, cin, cout, bias=False, kaiming=True)
                bp["short_bn"], bs["short_bn"] = bn_init(cout)
            blocks.append(bp)
            block_state.append(bs)
        p["blocks"], s["blocks"] = blocks, block_state
        p["head"] = linear_init(rng, cin, classes)
        return p, s

    def apply(p, s, x, cdt):
        new = {}
        h, new["stem_bn"] = batch_norm(p["stem_bn"], s["stem_bn"], conv(p["stem"], x, cdt))
        h = jax.nn.relu(h)
        new["blocks"] = []
        for (_, _, stride), bp, bs in zip(plan, p["blocks"], s["blocks"]):
            ns = {}
            y, ns["bn1"] = batch_norm(bp["bn1"], bs["bn1"], conv(bp["conv1"], h, cdt, stride))
            y, ns["bn2"] = batch_norm(bp["bn2"], bs["bn2"], conv(bp["conv2"], jax.nn.relu(y), cdt))
            short = h
            if "short" in bp:
                short, ns["short_bn"] = batch_norm(bp["short_bn"], bs["short_bn"],
                                                   conv(bp["short"], h, cdt, stride, padding=0))
            h = jax.nn.relu(y + short)
            new["blocks"].append(ns)
        return linear(p["head"], h.mean((1, 2)), cdt), new

    return init, apply


def gpt(vocab=256, seq_len=128, n_layer=4, n_head=4, d_model=256):
    """Byte-level GPT-2: token + learned position embeddings, pre-LN blocks (x + attn(ln1(x)), then
    x + mlp(ln2(x)), GELU tanh), final LN, head tied to wte. flowrun's `gpt2` init: 2-d weights N(0, 0.02),
    the residual projections N(0, 0.02 / sqrt(2 n_layer)), biases 0, layer norms 1 and 0."""
    d = d_model

    def ln():
        return {"g": np.ones(d, np.float32), "b": np.zeros(d, np.float32)}

    def dense(rng, fan_in, fan_out, std):
        return {"w": _normal(rng, (fan_in, fan_out), std), "b": np.zeros(fan_out, np.float32)}

    def init(rng):
        proj_std = 0.02 / math.sqrt(2 * n_layer)
        blocks = [{"ln1": ln(), "qkv": dense(rng, d, 3 * d, 0.02), "attn_proj": dense(rng, d, d, proj_std),
                   "ln2": ln(), "fc": dense(rng, d, 4 * d, 0.02), "mlp_proj": dense(rng, 4 * d, d, proj_std)}
                  for _ in range(n_layer)]
        return {"wte": _normal(rng, (vocab, d), 0.02), "wpe": _normal(rng, (seq_len, d), 0.02),
                "blocks": blocks, "ln_f": ln()}, {}

    def apply(p, s, idx, cdt):
        B, T = idx.shape
        x = p["wte"][idx] + p["wpe"][:T]
        for bp in p["blocks"]:
            q, k, v = jnp.split(linear(bp["qkv"], layer_norm(bp["ln1"], x), cdt), 3, axis=-1)
            q, k, v = (t.reshape(B, T, n_head, d // n_head) for t in (q, k, v))
            # softmax(q k^T / sqrt(head dim)) v with the causal mask; the XLA implementation takes the
            # softmax in fp32 whatever the operands' dtype, as PyTorch's CPU attention kernel does.
            a = jax.nn.dot_product_attention(q, k, v, is_causal=True)
            x = x + linear(bp["attn_proj"], a.reshape(B, T, d), cdt)
            h = jax.nn.gelu(linear(bp["fc"], layer_norm(bp["ln2"], x), cdt), approximate=True)
            x = x + linear(bp["mlp_proj"], h, cdt)
        h = layer_norm(p["ln_f"], x)
        return jnp.dot(h.astype(cdt), p["wte"].T.astype(cdt)), s

    return init, apply


# --- bench definitions ------------------------------------------------------------------------------


def decay_mask(params):
    """Weight decay on parameters of 2 or more dimensions only (flowrun's optimizer.decay_1d: false)."""
    return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)


def sgd(lr, momentum, weight_decay=0.0):
    """PyTorch's SGD: g += wd p (coupled decay), buf = momentum buf + g, p -= lr buf."""
    if not weight_decay:
        return optax.sgd(lr, momentum=momentum)
    return optax.chain(optax.add_decayed_weights(weight_decay, mask=decay_mask), optax.sgd(lr, momentum=momentum))


# name -> (model factory, batch, dataset, optimizer); keep in step with configs/bench/*.yaml and torch_models.BENCH.
BENCH = {
    "mlp": (mlp, 128, "fashion", sgd(0.05, 0.9)),
    "cnn": (cnn, 64, "fashion", sgd(0.02, 0.9)),
    "resnet": (resnet, 64, "fashion32", sgd(0.1, 0.9, weight_decay=5e-4)),
    "gpt-tiny": (gpt, 16, "kjv",
                 optax.adamw(1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mask=decay_mask)),
}
SEQ_LEN = 128


def build(name, seed=1):
    """(apply, params, state, optimizer, batch size, dataset kind) of bench `name`; params and state fp32."""
    factory, batch, data, opt = BENCH[name]
    init, apply = factory()
    params, state = jax.tree_util.tree_map(jnp.asarray, init(np.random.default_rng(seed)))
    return apply, params, state, opt, batch, data


def param_count(params):
    return sum(p.size for p in jax.tree_util.tree_leaves(params))


def loss_of(apply, params, state, x, y, cdt):
    """(mean cross-entropy, new state); the loss in fp32 as autocast computes cross_entropy."""
    logits, new_state = apply(params, state, x, cdt)
    logits = logits.astype(F32).reshape(-1, logits.shape[-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, y.reshape(-1)).mean(), new_state


def train_step(apply, opt, cdt):
    """The whole training step as one compiled function (params, state, opt_state, x, y) ->
    (params, state, opt_state, loss); the first three arguments' buffers are reused for the results."""

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def step(params, state, opt_state, x, y):
        (loss, state), grads = jax.value_and_grad(
            lambda p: loss_of(apply, p, state, x, y, cdt), has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, loss

    return step


# --- data -------------------------------------------------------------------------------------------
# As torch_models.py: the whole file stays in memory as bytes and each batch is gathered and converted
# (images: (x / 255 - mean) / std per channel, then NHWC; text: bytes -> int32 ids) when it is drawn.


class Images:
    """One split of an image HDF5 file: u8 (N, C, H, W) pixels, labels, per-channel mean and std."""

    def __init__(self, x_u8, y, mean, std):
        self.x = x_u8 if x_u8.ndim == 4 else x_u8[:, None]
        self.y = y.astype(np.int32)
        c = self.x.shape[1]
        self.mean = np.broadcast_to(mean, (c,)).astype(np.float32).reshape(1, c, 1, 1)
        self.std = np.broadcast_to(std, (c,)).astype(np.float32).reshape(1, c, 1, 1)

    def __len__(self):
        return len(self.y)

    def gather(self, idx):
        x = (self.x[idx].astype(np.float32) / 255.0 - self.mean) / self.std
        return jnp.asarray(x.transpose(0, 2, 3, 1)), jnp.asarray(self.y[idx])


def load_images(path):
    """(train, test) of an image HDF5 file, normalised as flowrun's loader does (bench_common.read_images)."""
    xtr, ytr, xte, yte, mean, std = read_images(path)
    return Images(xtr, ytr, mean, std), Images(xte, yte, mean, std)


class Text:
    """One split of a byte stream as flowrun samples it: sample i is input bytes [iT, iT+T) and targets
    [iT+1, iT+T+1), (bytes - 1) // T samples."""

    def __init__(self, stream_u8, seq_len):
        self.n = (len(stream_u8) - 1) // seq_len
        self.x = stream_u8[: self.n * seq_len].reshape(self.n, seq_len)
        self.y = stream_u8[1: self.n * seq_len + 1].reshape(self.n, seq_len)

    def __len__(self):
        return self.n

    def gather(self, idx):
        return jnp.asarray(self.x[idx].astype(np.int32)), jnp.asarray(self.y[idx].astype(np.int32))


def load_text(path, seq_len=SEQ_LEN):
    """(train, val) of flowrun's KJV HDF5 file (/train and /val byte streams)."""
    with h5py.File(path, "r") as f:
        return Text(f["train"][...], seq_len), Text(f["val"][...], seq_len)


def load(data_dir, kind):
    """(train, val) splits of bench dataset `kind`."""
    path = os.path.join(data_dir, {"fashion": "fashion_mnist.h5", "fashion32": "fashion_mnist_3x32.h5",
                                   "kjv": "kjv.h5"}[kind])
    return load_text(path) if kind == "kjv" else load_images(path)


class Batches:
    """Training batches as torch_models.Batches draws them: a fresh permutation per epoch seeded from
    (seed, epoch), floor(N / batch) full batches per epoch. numpy's permutation, not torch.randperm's, so
    the order of the samples differs from the PyTorch twin's."""

    def __init__(self, split, batch, seed=1):
        self.split, self.batch, self.seed = split, batch, seed
        self.epoch, self.index, self.order = -1, 0, None
        self.per_epoch = len(split) // batch

    def next(self):
        if self.order is None or self.index == self.per_epoch:
            self.epoch += 1
            self.index = 0
            self.order = np.random.default_rng(self.seed * 1000003 + self.epoch).permutation(len(self.split))
        idx = self.order[self.index * self.batch: (self.index + 1) * self.batch]
        self.index += 1
        return self.split.gather(idx)


def val_batches(split, batch, count):
    """The first `count` validation batches in order (all when count is 0), the last one possibly short."""
    n = len(split)
    total = (n + batch - 1) // batch if count == 0 else min(count, (n + batch - 1) // batch)
    return [split.gather(np.arange(b * batch, min((b + 1) * batch, n))) for b in range(total)]

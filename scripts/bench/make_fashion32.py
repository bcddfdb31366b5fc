"""Write Fashion-MNIST as CIFAR-shaped images for the resnet bench (no CIFAR offline here).

Reads flowrun's converted fashion_mnist.h5 and writes /train/x, /test/x u8 (N, 3, 32, 32) (each image
zero-padded by 2 pixels and repeated to 3 channels) and /train/y, /test/y i64, in flowrun's image layout
(data/README.md), under a temporary name renamed into place. No mean/std attributes: flowrun and
torch_models.load_images both normalise with the train pixels' statistics.

Usage: make_fashion32.py SRC.h5 OUT.h5
"""
import os
import sys

import h5py
import numpy as np


def cifar_shaped(x):
    padded = np.pad(x, ((0, 0), (2, 2), (2, 2)))
    return np.ascontiguousarray(np.repeat(padded[:, None], 3, axis=1))


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    src, out = argv
    tmp = f"{out}.tmp.{os.getpid()}"
    with h5py.File(src, "r") as f, h5py.File(tmp, "w") as g:
        for split in ("train", "test"):
            g[f"{split}/x"] = cifar_shaped(f[f"{split}/x"][...])
            g[f"{split}/y"] = f[f"{split}/y"][...].astype(np.int64)
        g.attrs["source"] = f"Fashion-MNIST padded to 32x32, 3 channels, from {src}"
        if "classes" in f.attrs:
            g.attrs["classes"] = f.attrs["classes"]
    os.replace(tmp, out)


if __name__ == "__main__":
    main(sys.argv[1:])

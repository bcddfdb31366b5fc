"""What the PyTorch and JAX bench scripts share: step-time statistics, peak RSS, and reading an image file as
flowrun's loader does. Standard library at import time (numpy and h5py are imported where they are used), so
that jax_step.py can import it before it pins its threads."""
import resource


def percentile(sorted_ms, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(sorted_ms) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (pos - lo)


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def pixel_stats(x_u8):
    """Per-channel mean and (population) std of pixels / 255 from a byte histogram, as flowrun computes
    them, without a float copy of the whole split."""
    import numpy as np

    x = x_u8 if x_u8.ndim == 4 else x_u8[:, None]
    v = np.arange(256, dtype=np.float64) / 255.0
    mean, std = [], []
    for c in range(x.shape[1]):
        h = np.zeros(256)
        for i in range(0, len(x), 4096):  # bincount widens its input to intp: keep the chunks small
            h += np.bincount(x[i: i + 4096, c].ravel(), minlength=256)
        m = (h * v).sum() / h.sum()
        mean.append(m)
        std.append(np.sqrt(max((h * v * v).sum() / h.sum() - m * m, 0.0)))
    return np.array(mean), np.array(std)


def read_images(path):
    """An image HDF5 file's (x_train, y_train, x_test, y_test, mean, std): mean and std from the root
    attributes if present, else the train pixels' statistics, as flowrun's loader chooses them."""
    import h5py
    import numpy as np

    with h5py.File(path, "r") as f:
        xtr, ytr = f["train/x"][...], f["train/y"][...]
        xte, yte = f["test/x"][...], f["test/y"][...]
        if "mean" in f.attrs and "std" in f.attrs:
            mean, std = np.asarray(f.attrs["mean"], np.float64), np.asarray(f.attrs["std"], np.float64)
        else:
            mean, std = pixel_stats(xtr)
    return xtr, ytr, xte, yte, mean, std

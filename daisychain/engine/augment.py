"""The image task's training recipe that lives outside the units: deterministic shift
augmentation and the learning-rate schedule (docs/DATA.md, "Augmentation" and "Learning-rate
schedule"). Both are pure functions of the run's settings and the step, so every peer, tab
and the reference trainer compute them alike, and both are part of the run identity
(``Hyper.augment_shift``, ``Hyper.lr_warmup``, ``Hyper.lr_decay_steps``).

Shift augmentation, for the sample in slot ``j`` of step ``t``'s global batch (``j =
micro * micro_batch + k``: micro-batch ``micro``, its ``k``-th sample) with ``s =
augment_shift``::

    u  = prng.u32(seed, STREAM_AUGMENT + t, j)      # the integer PRNG, docs/ENGINE.md
    dx = (u mod (2s + 1)) - s                        # u a non-negative 32-bit integer
    dy = ((u >> 16) mod (2s + 1)) - s
    out[c, y, x] = in[c, y - dy, x - dx]   when 0 <= y - dy < H and 0 <= x - dx < W, else 0

(the picture moves right by dx and down by dy; pixels shifted in are 0). The test set is
never augmented.

Learning-rate schedule, for the Adam update with index ``t`` (0 for the first update of the
run; ``W = lr_warmup``, ``D = lr_decay_steps``), IEEE float64, each line one operation::

    t < W:           lr_t = lr * ((t + 1) / W)           # linear warm-up
    D > 0, t >= D:   lr_t = 0
    D > 0, t < D:    lr_t = lr * ((D - t) / (D - W))      # linear decay to 0 at step D
    otherwise:       lr_t = lr

(``t + 1``, ``D - t`` and ``D - W`` are integers, exact in float64.) No pow, no exp.
"""

from __future__ import annotations

import numpy as np

from daisychain.compiled import built_once, numba_jit
from daisychain.engine import prng

STREAM_AUGMENT = 1 << 22  #: + step: the augmentation draws of that step
MAX_SHIFT = 8


def shifts(seed: int, step: int, slots: np.ndarray, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dy) int64 arrays for the given batch slots of a step."""
    slots = np.asarray(slots, np.int64).reshape(-1)
    r = 2 * shift + 1
    if slots.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo, hi = int(slots.min()), int(slots.max())
    u = prng.u32(seed, STREAM_AUGMENT + step, hi - lo + 1, lo)[slots - lo].astype(np.int64)
    return u % r - shift, (u >> 16) % r - shift


def _nb_shift(x, c, h, w, dx, dy, out):
    """out[i, (ch*h + y)*w + x] = x[i, (ch*h + y - dy[i])*w + x - dx[i]], 0 outside."""
    for i in range(x.shape[0]):
        sx, sy = dx[i], dy[i]
        for ch in range(c):
            for y in range(h):
                row = (ch * h + y) * w
                yy = y - sy
                if yy < 0 or yy >= h:
                    for xx in range(w):
                        out[i, row + xx] = 0
                else:
                    src = (ch * h + yy) * w - sx
                    lo, hi = max(0, sx), min(w, w + sx)  # 0 <= xx - sx < w
                    for xx in range(min(lo, w)):
                        out[i, row + xx] = 0
                    for xx in range(lo, hi):
                        out[i, row + xx] = x[i, src + xx]
                    for xx in range(max(hi, 0), w):
                        out[i, row + xx] = 0


_shift_kernel = built_once(lambda: (lambda jit: jit(_nb_shift) if jit is not None else None)(numba_jit()))


def shift_images(x: np.ndarray, shape: tuple[int, int, int], dx: np.ndarray,
                 dy: np.ndarray) -> np.ndarray:
    """x (M, C*H*W) uint8 channel-major rows, each moved by its (dx, dy) with zero fill: one
    compiled pass (~50x the numpy gather below, which is its definition and the path without
    numba: a step's inputs are serial work of every ``--threads N``)."""
    c, h, w = shape
    m = len(x)
    s = int(max(np.abs(dx).max(initial=0), np.abs(dy).max(initial=0)))
    if s == 0:
        return x.copy()
    kern = _shift_kernel() if m and x.ndim == 2 and x.shape[1] == c * h * w else None
    if kern is not None:
        out = np.empty_like(x, order="C")
        kern(np.ascontiguousarray(x), c, h, w, np.ascontiguousarray(dx, np.int64),
             np.ascontiguousarray(dy, np.int64), out)
        return out
    return shift_images_numpy(x, shape, dx, dy)


def shift_images_numpy(x: np.ndarray, shape: tuple[int, int, int], dx: np.ndarray,
                       dy: np.ndarray) -> np.ndarray:
    """:func:`shift_images` by numpy indexing (the definition; the path without numba)."""
    c, h, w = shape
    m = len(x)
    s = int(max(np.abs(dx).max(initial=0), np.abs(dy).max(initial=0)))
    if s == 0:
        return x.copy()
    pad = np.zeros((m, c, h + 2 * s, w + 2 * s), x.dtype)
    pad[:, :, s:s + h, s:s + w] = x.reshape(m, c, h, w)
    rows = (s - dy)[:, None] + np.arange(h)[None, :]  # (m, h): in-row y - dy, padded
    cols = (s - dx)[:, None] + np.arange(w)[None, :]
    out = pad[np.arange(m)[:, None, None, None], np.arange(c)[None, :, None, None],
              rows[:, None, :, None], cols[:, None, None, :]]
    return np.ascontiguousarray(out.reshape(m, c * h * w))


def step_inputs(ds, hp, schedule, step: int, micro_ids) -> tuple[np.ndarray, np.ndarray]:
    """The training inputs and labels of the given micro-batches of a step: x (n, b, F),
    y (n, b), augmented when ``hp.augment_shift`` is set (an image task)."""
    ids = np.asarray(micro_ids, np.int64).reshape(-1)
    idx = schedule.step_samples(step)[ids]
    x = ds.x_train[idx]
    if hp.augment_shift:
        b = hp.micro_batch
        slots = (ids[:, None] * b + np.arange(b)[None, :]).reshape(-1)
        dx, dy = shifts(hp.seed, step, slots, hp.augment_shift)
        x = shift_images(x.reshape(len(slots), -1), ds.image_shape, dx, dy).reshape(x.shape)
    return x, ds.y_train[idx]


def lr_at(hp, t: int) -> float:
    """The learning rate of Adam update ``t`` (0-based): the module docstring's schedule."""
    lr, w, d = hp.lr, hp.lr_warmup, hp.lr_decay_steps
    if t < w:
        return lr * (float(t + 1) / float(w))
    if d > 0:
        if t >= d:
            return 0.0
        return lr * (float(d - t) / float(d - w))
    return lr

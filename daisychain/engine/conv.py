"""The data movement of conv2d and maxpool2d (no arithmetic but exact integer sums):
im2col, its adjoint col2im, the 2x2 max pool and its backward scatter. The reference
definitions in numpy; docs/ENGINE.md and CONV_SPEC give the index formulas.

Activations are (n, b, C*H*W), channel-major per sample; columns matrices are
(n, b*H*W, Ci*k*k) with row r = s*H*W + y*W + x and column j = ci*k*k + dy*k + dx.
"""

from __future__ import annotations

import numpy as np


def im2col(a: np.ndarray, ci: int, h: int, w: int, k: int) -> np.ndarray:
    """cols[m, s*H*W + y*W + x, ci*k*k + dy*k + dx] = a[m, s, ci, y+dy-p, x+dx-p] (0 outside)."""
    n, b = a.shape[0], a.shape[1]
    p = (k - 1) // 2
    x = np.zeros((n, b, ci, h + 2 * p, w + 2 * p), a.dtype)
    x[:, :, :, p:p + h, p:p + w] = a.reshape(n, b, ci, h, w)
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(3, 4))  # (n, b, ci, h, w, k, k)
    return np.ascontiguousarray(win.transpose(0, 1, 3, 4, 2, 5, 6)).reshape(n, b * h * w, ci * k * k)


def col2im(d: np.ndarray, b: int, ci: int, h: int, w: int, k: int) -> np.ndarray:
    """The adjoint of im2col: dX[m, s, ci, yy, xx] = sum of d[m, r, j] over every (r, j) that
    im2col read from (s, ci, yy, xx); padding positions are dropped. Exact integer sums
    (float64, every partial sum below 2**53). Returns (n, b, ci*h*w)."""
    n = d.shape[0]
    p = (k - 1) // 2
    d = d.reshape(n, b, h, w, ci, k, k)
    x = np.zeros((n, b, ci, h + 2 * p, w + 2 * p), np.float64)
    for dy in range(k):
        for dx in range(k):
            x[:, :, :, dy:dy + h, dx:dx + w] += d[:, :, :, :, :, dy, dx].transpose(0, 1, 4, 2, 3)
    return np.ascontiguousarray(x[:, :, :, p:p + h, p:p + w]).reshape(n, b, ci * h * w)


def _windows(a: np.ndarray, c: int, h: int, w: int) -> np.ndarray:
    """(n, b, c, h/2, w/2, 4): the 2x2 windows in the scan order (0,0), (0,1), (1,0), (1,1)."""
    n, b = a.shape[0], a.shape[1]
    h2, w2 = h // 2, w // 2
    v = a.reshape(n, b, c, h, w)[:, :, :, :2 * h2, :2 * w2].reshape(n, b, c, h2, 2, w2, 2)
    return v.transpose(0, 1, 2, 3, 5, 4, 6).reshape(n, b, c, h2, w2, 4)


def maxpool(a: np.ndarray, c: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """2x2 max pool, stride 2: (out (n, b, c*(h//2)*(w//2)), argmax (n, b, c, h//2, w//2) in
    0..3, the FIRST position of the scan order holding the maximum)."""
    win = _windows(a, c, h, w)
    arg = win.argmax(axis=-1)  # numpy's argmax returns the first maximum
    out = np.take_along_axis(win, arg[..., None], axis=-1)[..., 0]
    return out.reshape(a.shape[0], a.shape[1], -1), arg.astype(np.int8)


def maxpool_back(g: np.ndarray, arg: np.ndarray, c: int, h: int, w: int) -> np.ndarray:
    """G' (n, b, c*h*w): g (n, b, c*(h//2)*(w//2)) at each window's argmax, 0 elsewhere (and
    on a dropped odd last row/column)."""
    n, b = g.shape[0], g.shape[1]
    h2, w2 = h // 2, w // 2
    gw = g.reshape(n, b, c, h2, w2)
    out = np.zeros((n, b, c, h, w), g.dtype)
    for i in range(2):
        for j in range(2):
            out[:, :, :, i:2 * h2:2, j:2 * w2:2] = np.where(arg == 2 * i + j, gw, 0)
    return out.reshape(n, b, c * h * w)

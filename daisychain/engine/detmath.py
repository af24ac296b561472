"""Portable float arithmetic: only IEEE + - * / sqrt, floor and comparisons, in a fixed order.

Every function here has a line-for-line JS mirror (``webui/engine``); see docs/ENGINE.md.
numpy applies one ufunc per element for these operations, which is IEEE round-to-nearest,
and never fuses a multiply and an add.
"""

from __future__ import annotations

import numpy as np

# exp: range reduction by ln2 split in two parts (fdlibm), a fixed degree-11 Taylor
# polynomial in Horner form, then an exact scaling by 2**k. Coefficients are 1/i!
# correctly rounded to float64, written as shortest round-trip decimals (JS and Python
# both parse these exactly).
LN2_HI = 0.6931471803691238  # 0x3fe62e42fee00000, low 32 bits zero: k * LN2_HI is exact
LN2_LO = 1.9082149292705877e-10  # 0x3dea39ef35793c76
INV_LN2 = 1.4426950408889634  # 0x3ff71547652b82fe
EXP_MIN = -80.0
EXP_COEFFS = (  # c[i] = 1 / i!, i = 0..11
    1.0, 1.0, 0.5, 0.16666666666666666, 0.041666666666666664, 0.008333333333333333,
    0.001388888888888889, 0.0001984126984126984, 2.48015873015873e-05,
    2.7557319223985893e-06, 2.755731922398589e-07, 2.505210838544172e-08,
)


def dexp(x: np.ndarray) -> np.ndarray:
    """exp(x) for x <= 0 (inputs below -80 are clamped to -80), bit-identical to the JS one.

    k = floor(x * INV_LN2 + 0.5); r = (x - k * LN2_HI) - k * LN2_LO;
    p = c11; p = p * r + c10; ...; p = p * r + c0; result = p * 2**k.
    """
    x = np.maximum(np.asarray(x, np.float64), EXP_MIN)
    k = np.multiply(x, INV_LN2)
    k += 0.5
    np.floor(k, out=k)
    t = np.multiply(k, LN2_HI)
    r = np.subtract(x, t, out=x)  # x is our own copy (np.maximum made it)
    np.multiply(k, LN2_LO, out=t)
    r -= t
    p = np.multiply(r, EXP_COEFFS[11], out=t)  # p = c11; p = p * r + c10; ...
    p += EXP_COEFFS[10]
    for c in EXP_COEFFS[9::-1]:
        p *= r
        p += c
    return np.ldexp(p, k.astype(np.int64), out=p)


def exponent(m: np.ndarray) -> np.ndarray:
    """frexp exponent: m = f * 2**e with f in [0.5, 1); 0 for m == 0. For an integer m >= 1
    this is its bit length."""
    return np.frexp(np.asarray(m, np.float64))[1].astype(np.int64)


def pow2(e: np.ndarray) -> np.ndarray:
    """2**e as float64, exactly (e in the normal range)."""
    return np.ldexp(1.0, np.asarray(e, np.int64))


def quant_exponent(m: np.ndarray) -> np.ndarray:
    """Scale exponent for a tensor whose max |value| is m: e = exponent(m) - 7, so that
    m * 2**-e lies in [64, 128); e = 0 when m == 0."""
    m = np.asarray(m, np.float64)
    return np.where(m > 0, exponent(m) - 7, 0)


def quantize(v: np.ndarray, e: np.ndarray) -> np.ndarray:
    """q = clamp(floor(v * 2**-e + 1/2), -127, 127), as float64 holding integers.

    ``e`` broadcasts against ``v`` (one exponent per micro-batch, or one per tensor)."""
    return np.clip(np.floor(v * pow2(-np.asarray(e)) + 0.5), -127.0, 127.0)


def zero_sum_errors(G: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The quantized output errors made zero-sum per sample (engine version 2).

    ``G`` (..., C) holds the int8 errors q(p - onehot(y)) as floats, ``y`` the labels (the
    leading shape of G). Per sample, s = the sum of the other entries (exact, at most
    C * 127, all >= 0): G[y] = 0 - s when s <= 127; otherwise G[y] = -127 and the excess
    s - 127 is taken off the others one unit at a time, each time from the largest (the
    lowest class on a tie). The true error p - onehot(y) sums to zero over the classes;
    rounding most of a row's small probabilities to 0 broke that, and the bias pushed the
    logits one way every step: the text model's validation loss rose again on long runs.
    ``0 - s`` keeps s == 0 a +0. Returns the array (G's own memory when contiguous).

    Exact and bounded: s is a sum of at most C integers <= 127 (float64, exact below 2**53);
    the entries are rounded from values >= 0 that sum to less than 128, so fewer than 256 of
    them round up to 1 or more, s < 256 and the trim loop runs at most 128 times
    whatever the vocabulary (an uploaded text cannot make it longer). A sequence model's
    errors round stochastically (engine/sround.py): each entry is then below its value + 1,
    so s < 128 + C - 1 and the loop runs fewer than C times."""
    C = G.shape[-1]
    G2 = G.reshape(-1, C)
    yv = np.asarray(y, np.int64).reshape(-1)
    rows = np.arange(len(yv))
    s = np.add.reduce(G2, axis=-1, dtype=np.float64)
    s -= G2[rows, yv]
    over = s - 127.0
    np.subtract(0.0, s, out=s)
    G2[rows, yv] = np.maximum(s, -127.0)
    big = np.flatnonzero(over > 0)
    if big.size:  # a nearly uniform row (early in training): C * 1/2 of rounding up
        sub = G2[big]  # a copy: the rows to trim
        sub[np.arange(big.size), yv[big]] = -np.inf  # never the true class
        left = over[big]
        for _ in range(int(left.max())):
            act = np.flatnonzero(left > 0)
            sub[act, np.argmax(sub[act], axis=-1)] -= 1.0
            left -= 1.0
        sub[np.arange(big.size), yv[big]] = -127.0
        G2[big] = sub
    return G2.reshape(G.shape)


def mse_output_error(z: np.ndarray, y: np.ndarray):
    """The mean squared error's output error: z, y (n, b, K) float64 (outputs and targets).
    dz = (z - y) / b, the gradient of 1/2 * sum_k (z_k - y_k)**2 averaged over the
    micro-batch (the same shape of error as cross-entropy's p - onehot); the display loss is
    the mean over the micro-batch and the outputs of (z - y)**2; no correct count (0).
    One IEEE subtraction and one division per element: the same bits in numpy and JS
    (webui/engine/model.js mseOutputError)."""
    n, b = z.shape[:2]
    if y.shape != z.shape:
        raise ValueError(f"mse targets of shape {y.shape[1:]} for outputs of shape {z.shape[1:]}")
    d = np.subtract(z, y)
    loss = (d * d).reshape(n, -1).mean(axis=1)  # display only
    d /= float(b)
    return d, loss, np.zeros(n, np.int64)

"""The transformer's integer rules besides the GEMMs (docs/ENGINE.md, "The transformer"):
rounding shifts, rounded integer division, the integer square root, wide values and their
align-add, and RMSNorm forward and backward.

Everything is exact integer arithmetic on int64 (every intermediate below 2**53, so JS holds
the same values in Numbers); the engine's arrays hold integers in float64 and come back as
such. ``q`` arrays are per row, ``e`` exponents per micro-batch (the leading axis).
"""

from __future__ import annotations

import numpy as np

from daisychain.engine.detmath import exponent

WIDE_BITS = 15  #: wide values (the residual stream and its error) satisfy |v| <= 2**15
NORM_F = 10  #: rmsnorm's y = x / rms(x) * 2**NORM_F


def _i64(v) -> np.ndarray:
    return np.asarray(v).astype(np.int64)


def bitlen(m) -> np.ndarray:
    """Bit length of integers m >= 0 (0 for 0): the frexp exponent."""
    return exponent(np.asarray(m, np.float64))


def per_mb(e, ndim: int) -> np.ndarray:
    return np.asarray(e).reshape((-1,) + (1,) * (ndim - 1))


def absmax(x: np.ndarray) -> np.ndarray:
    """max |x| per micro-batch (axis 0)."""
    return np.abs(x).reshape(x.shape[0], -1).max(axis=1)


def rshift(v, k) -> np.ndarray:
    """floor(v / 2**k + 1/2) for integers v and k >= 0 (round half up), int64. A k above 40
    acts as 40 (the result is then 0 or -0 for every |v| < 2**39 this engine shifts)."""
    v = _i64(v)
    k = np.minimum(_i64(k), 40)
    return (v + (np.left_shift(np.int64(1), k) >> 1)) >> k  # k = 0: v + 0


def idiv(p, q) -> np.ndarray:
    """floor(p / q) for integers p >= 0, q > 0 (JS: the IEEE quotient floored, then corrected
    by one step each way; numpy int64 floor division is exact)."""
    return _i64(p) // _i64(q)


def sdiv(a, m) -> np.ndarray:
    """sign(a) * floor((2|a| + m) / (2m)) for m > 0: a / m rounded half away from zero."""
    a, m = _i64(a), _i64(m)
    return np.sign(a) * idiv(2 * np.abs(a) + m, 2 * m)


def isqrt(v) -> np.ndarray:
    """The largest q with q*q <= v, for integers 0 <= v < 2**53: floor(sqrt(v)) corrected."""
    v = _i64(v)
    q = np.floor(np.sqrt(v.astype(np.float64))).astype(np.int64)
    q = np.where(q * q > v, q - 1, q)
    return np.where((q + 1) * (q + 1) <= v, q + 1, q)


def _rshift_f(V: np.ndarray, k) -> np.ndarray:
    """rshift on integers held in float64 (|V| < 2**52): floor(V * 2**-k + 1/2), exact."""
    x = V * np.ldexp(1.0, -np.asarray(k, np.int64))
    x += 0.5
    return np.floor(x, out=x)


def norm15(V, e) -> tuple[np.ndarray, np.ndarray]:
    """A wide value: t = max(0, bitlen(max|V|) - 15) per micro-batch, V = rshift(V, t), e + t.
    Integers held in float64 (exact below 2**52), returned as float64."""
    V = np.asarray(V, np.float64)
    t = np.maximum(bitlen(absmax(V)) - WIDE_BITS, 0)
    e = np.asarray(e, np.int64) + t
    return (V if not t.any() else _rshift_f(V, per_mb(t, V.ndim))), e


def align_add(ops) -> tuple[np.ndarray, np.ndarray]:
    """The sum of (V_i, e_i) (same shape, exponents per micro-batch), as a wide value: each
    made wide (norm15); over the operands not all zero in the micro-batch, e = max(lowest
    e_i, highest e_i - 16) (all zero: e_1); S = the sum in order of V_i * 2**(e_i - e) where
    e_i >= e (exact, below 2**32) and rshift(V_i, e - e_i) where e_i < e; then norm15(S, e).
    So operands within 16 bits of each other are added exactly and rounded once. Integers in
    float64 (every value exact), returned as float64."""
    ops = [norm15(V, e) for V, e in ops]
    nz = np.stack([absmax(V) > 0 for V, _ in ops])  # (k, n)
    es = np.stack([e for _, e in ops])
    big = np.iinfo(np.int64).max
    hi = np.where(nz, es, -big).max(axis=0)
    lo = np.where(nz, es, big).min(axis=0)
    e = np.where(nz.any(axis=0), np.maximum(lo, hi - 16), es[0])
    S = None
    for V, ei in ops:
        d = ei - e  # (n,)
        if (d >= 0).all():
            term = V * per_mb(np.ldexp(1.0, np.minimum(d, 16)), V.ndim)  # exact left shift
        else:
            term = np.where(per_mb(d, V.ndim) >= 0, V * per_mb(np.ldexp(1.0, np.clip(d, 0, 16)), V.ndim),
                            _rshift_f(V, per_mb(np.minimum(np.maximum(-d, 0), 40), V.ndim)))
        S = term if S is None else S + term
    return norm15(S, e)


def norm_constant(D: int) -> int:
    """C = isqrt(D * 2**(2F)) = floor(sqrt(D) * 2**F)."""
    return int(isqrt(np.int64(D) << (2 * NORM_F)))


def rms_forward(x: np.ndarray) -> tuple[np.ndarray, tuple]:
    """RMSNorm of the rows of x (n, R, D) (wide integers): y = sdiv(x' * C, q) per row with
    x' = x * 2**j (max|x'| in [2**14, 2**15]), q = isqrt(sum x'^2); a zero row gives 0.
    Returns y (int64, |y| <= C + 1, exponent -F) and the cache (y, q, j) for the backward."""
    x = _i64(x)
    D = x.shape[-1]
    C = norm_constant(D)
    m = np.abs(x).max(axis=-1)  # (n, R)
    j = np.where(m > 0, np.maximum(WIDE_BITS - bitlen(m), 0), 0)
    xs = x << j[..., None]
    ss = (xs * xs).sum(axis=-1)  # exact, < 2**42
    q = isqrt(ss)
    y = np.where(q[..., None] > 0, sdiv(xs * C, np.maximum(q, 1)[..., None]), 0)
    return y, (y, q, j)


def rms_backward(g: np.ndarray, eg, ex, cache) -> tuple[np.ndarray, np.ndarray]:
    """The input error of rms_forward from int8 errors g (n, R, D) with exponent eg, the
    norm's input exponent ex: dx = rshift(w * C, J - j) with w = sdiv(g * N - y * Pr, D * q),
    Pr = sum y * g, N = D * 2**(2F), J = max j over the micro-batch's non-zero rows; exponent
    eg - 3F - ex + J. Returns the wide value (float64) and its exponent."""
    y, q, j = cache
    g = _i64(g)
    D = g.shape[-1]
    C = norm_constant(D)
    Pr = (y * g).sum(axis=-1)  # < 2**32
    num = g * (D << (2 * NORM_F)) - y * Pr[..., None]  # < 2**48
    live = q > 0
    w = np.where(live[..., None], sdiv(num, (D * np.maximum(q, 1))[..., None]), 0)
    z = w * C  # < 2**50
    J = np.where(live, j, np.iinfo(np.int64).min).max(axis=1)
    J = np.where(live.any(axis=1), J, 0)
    dx = np.where(live[..., None], rshift(z, (J[:, None] - j)[..., None]), 0)
    return norm15(dx, np.asarray(eg, np.int64) - 3 * NORM_F - np.asarray(ex, np.int64) + J)

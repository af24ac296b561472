"""The compiled kernels of the engine's fast paths (numba, no fastmath), shared by the dense
path (``engine/fast.py``) and the image path (``engine/convfast.py``), and the fixed-point
sum both use.

Each kernel computes the same values as the dense path's numpy passes, which are the
definition (tests/engine/test_engine_fast.py holds them to the literal engine's bits), or returns
False where its preconditions fail, and the numpy passes run.
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np

from daisychain.compiled import numba_jit

#: a bias accumulator is clamped to +-BIAS_LIMIT (docs/ENGINE.md)
BIAS_LIMIT = 2.0**30


def fixed_sum(ints: np.ndarray, e: np.ndarray, frac_bits: int, limit: float) -> np.ndarray:
    """sum over micro-batches (axis 0) of floor(clamp(ints * 2**(e + S), -L, L) + 1/2), int64."""
    x = ints * np.ldexp(1.0, e + frac_bits).reshape((-1,) + (1,) * (ints.ndim - 1))
    np.minimum(x, limit, out=x)
    np.maximum(x, -limit, out=x)
    x += 0.5
    q = np.floor(x, out=x).astype(np.int64)
    return q.sum(axis=0)


# ---------------------------------------------------------------------- compiled kernels
# The compiled path (FastPath._forward_nb / _grad_nb) runs every pass between the GEMMs as
# one loop each, compiled by numba without fastmath: every float operation is the one IEEE
# float64 operation written, in the order written (LLVM neither fuses a multiply and an
# add nor reorders), and everything else is integer arithmetic, exact in any order. Each
# kernel computes the same values as the numpy passes above (tests/engine/test_engine_fast.py
# holds them to the literal engine's bits), or returns False where its preconditions
# fail (a non-finite value, an exponent outside +-_EXP_LIMIT): the numpy passes then run.
#
# Integer-valued float32 arrays (GEMM operands and outputs, below 2**24 in magnitude) are
# read as int64 exactly. Accumulator plus bias is below 2**24 + 2**30 < 2**31, so the
# rounding shift is the integer one of docs/UNITS.md: floor(v * 2**-s + 1/2) ==
# (v + 2**(s-1)) >> s for s >= 1 (arithmetic shift = floor division), v for s == 0.

_EXP_LIMIT = 900  #: every 2**e used below has |e| <= this: normal, and products stay finite
_MAG = 0x7FFFFFFFFFFFFFFF  #: clears the sign bit of a float64's bit pattern
_EXP_ALL = 0x7FF0000000000000  #: bit patterns at or above this (sign cleared): inf or NaN


def _nb_quant_rows(x, out, e):
    """Per row i of x (rows, F) float64: m = max|x_i|, e_i = exponent(m) - 7 (0 where
    m == 0), out_i = clamp(floor(x_i * 2**-e_i + 1/2), -127, 127) in float32 (as
    _quant_exp and _quantize). max|x| is taken on the bit patterns: for floats >= 0 the
    order is that of the integers, and the frexp exponent of a normal m is its biased
    exponent - 1022. False where a row holds inf, NaN or a subnormal max, or |e_i| >
    _EXP_LIMIT."""
    rows, F = x.shape
    bits = x.view(np.int64)
    for i in range(rows):
        mb = np.int64(0)
        for j in range(F):
            v = bits[i, j] & _MAG
            if v > mb:
                mb = v
        if mb >= _EXP_ALL:
            return False
        if mb == 0:
            ei = 0
        elif mb < (np.int64(1) << 52):  # subnormal
            return False
        else:
            ei = (mb >> 52) - 1022 - 7
        if ei > _EXP_LIMIT or ei < -_EXP_LIMIT:
            return False
        e[i] = ei
        scale = math.ldexp(1.0, -ei)
        for j in range(F):
            t = x[i, j] * scale
            t = t + 0.5
            t = np.floor(t)
            if t > 127.0:
                t = 127.0
            if t < -127.0:
                t = -127.0
            out[i, j] = t
    return True


def _nb_bias_acc(bias, sexp, bacc):
    """bacc = clamp(floor(bias * 2**-sexp + 1/2), -2**30, 2**30) as int64 (float64 ops as
    in forward); False for a NaN bias or |sexp| > _EXP_LIMIT."""
    if sexp > _EXP_LIMIT or sexp < -_EXP_LIMIT:
        return False
    p = math.ldexp(1.0, -sexp)
    for o in range(bias.shape[0]):
        t = bias[o] * p
        t = t + 0.5
        t = np.floor(t)
        if t > BIAS_LIMIT:
            t = BIAS_LIMIT
        elif t < -BIAS_LIMIT:
            t = -BIAS_LIMIT
        elif not (t == t):
            return False
        bacc[o] = np.int64(t)
    return True


def _nb_bitlen(m):
    """Bit length of an integer 0 <= m < 2**62 (== the frexp exponent of float(m))."""
    n = 0
    while m >> n:
        n += 1
    return n


def _nb_shift_rows(m, add, r0, r1, am, lo):
    """Rows r0 .. r1 of m (exact integers) in place: m = clamp((m + add + half) >> s, lo,
    127), the round-shift of docs/UNITS.md, with s = max(0, bitlen(am) - 7) for am = max
    |m + add| over those rows; returns s."""
    s = _nb_bitlen(am) - 7
    if s < 0:
        s = 0
    half = (np.int64(1) << s) >> 1
    for r in range(r0, r1):
        for c in range(m.shape[1]):
            q = (np.int64(m[r, c]) + add[c] + half) >> s
            if q > 127:
                q = 127
            if q < lo:
                q = lo
            m[r, c] = q
    return s


def _nb_hidden(acc, bias, ex, ew, b, lo, ex_out, bacc):
    """In place, per micro-batch j (rows j*b .. j*b+b of acc, float32 GEMM output): v =
    acc + bacc (exact integers), s = max(0, bitlen(max|v|) - 7), acc = clamp(round-shift(v,
    s), lo, 127); ex_out[j] = ex[j] + ew + s."""
    n = ex.shape[0]
    cols = acc.shape[1]
    for j in range(n):
        sexp = ex[j] + ew
        if not _nb_bias_acc(bias, sexp, bacc):
            return False
        am = np.int64(0)
        for r in range(j * b, j * b + b):
            for o in range(cols):
                v = np.int64(acc[r, o]) + bacc[o]
                if v < 0:
                    v = -v
                if v > am:
                    am = v
        ex_out[j] = sexp + _nb_shift_rows(acc, bacc, j * b, j * b + b, am, lo)
    return True


def _nb_logits(acc, bias, ex, ew, b, z, bacc):
    """z = (acc + bacc) * 2**(ex + ew) per micro-batch (float64; the integer sum is exact,
    the product by a power of two exact for |sexp| <= _EXP_LIMIT)."""
    n = ex.shape[0]
    cols = acc.shape[1]
    for j in range(n):
        sexp = ex[j] + ew
        if not _nb_bias_acc(bias, sexp, bacc):
            return False
        p = math.ldexp(1.0, sexp)
        for r in range(j * b, j * b + b):
            for o in range(cols):
                z[r, o] = np.float64(np.int64(acc[r, o]) + bacc[o]) * p
    return True


#: 2**k for k in [_POW2_LO, 0]: dexp's k lies in [-116, 0] (x clamped to [-80, 0]), where p *
#: 2**k (p in [0.7, 1.5]) is a normal float64, so the multiply is exact and equals
#: ldexp(p, k); a table read is a tenth of the time of libm's ldexp call per value
_POW2_LO = -128
_POW2 = np.ldexp(1.0, np.arange(_POW2_LO, 1))


def _nb_dexp(x):
    """detmath.dexp for one finite x <= 0, the same operations in the same order (the final
    ldexp(p, k) as the exact product p * 2**k, from the table _POW2)."""
    if not (x >= -80.0):  # np.maximum(x, EXP_MIN); x is finite here
        x = -80.0
    k = x * 1.4426950408889634  # INV_LN2
    k = k + 0.5
    k = np.floor(k)
    t = k * 0.6931471803691238  # LN2_HI
    r = x - t
    t = k * 1.9082149292705877e-10  # LN2_LO
    r = r - t
    p = r * 2.505210838544172e-08  # c11
    p = p + 2.755731922398589e-07  # c10
    p = p * r
    p = p + 2.7557319223985893e-06
    p = p * r
    p = p + 2.48015873015873e-05
    p = p * r
    p = p + 0.0001984126984126984
    p = p * r
    p = p + 0.001388888888888889
    p = p * r
    p = p + 0.008333333333333333
    p = p * r
    p = p + 0.041666666666666664
    p = p * r
    p = p + 0.16666666666666666
    p = p * r
    p = p + 0.5
    p = p * r
    p = p + 1.0
    p = p * r
    p = p + 1.0  # c0
    return p * _POW2[np.int64(k) - _POW2_LO]


def _nb_output_error(z, y, b, dz, py, correct):
    """Per row (sample) of z (rows, C) float64, as output_error: e_c = dexp(z_c - max z),
    total = 0 + e_0 + e_1 + ... in class order, p_c = e_c / total; py = p_y; dz = p / b
    except dz_y = (p_y - 1) / b; correct[j] = rows of micro-batch j whose first maximal z
    is at y. False where a z is not finite or a label is outside [0, C)."""
    rows, C = z.shape
    fb = np.float64(b)
    for j in range(rows // b):
        correct[j] = 0
    for r in range(rows):
        yr = y[r]
        if yr < 0 or yr >= C:
            return False
        m = z[r, 0]
        am = 0
        for c in range(C):
            if not (abs(z[r, c]) < np.inf):
                return False
            if z[r, c] > m:
                m = z[r, c]
                am = c
        if am == yr:
            correct[r // b] += 1
        for c in range(C):  # the exps apart from their sum: this loop vectorizes
            dz[r, c] = _nb_dexp(z[r, c] - m)
        total = 0.0
        for c in range(C):  # the sum in class order, as before
            total = total + dz[r, c]
        for c in range(C):
            dz[r, c] = dz[r, c] / total
        p = dz[r, yr]
        py[r] = p
        dz[r, yr] = p - 1.0
        for c in range(C):
            dz[r, c] = dz[r, c] / fb
    return True


def _nb_bias_grad(G, b, eg, frac_bits, limit, dst, col):
    """dst = sum over micro-batches j of floor(clamp(db_j * 2**(eg_j + S), -L, L) + 1/2),
    db_j the column sums of G's rows j*b .. j*b+b (exact integers), as _fixed_sum. False
    for |eg_j + S| > _EXP_LIMIT."""
    n = eg.shape[0]
    cols = G.shape[1]
    for o in range(cols):
        dst[o] = 0
    for j in range(n):
        e = eg[j] + frac_bits
        if e > _EXP_LIMIT or e < -_EXP_LIMIT:
            return False
        p = math.ldexp(1.0, e)
        for o in range(cols):
            col[o] = 0
        for r in range(j * b, j * b + b):
            for o in range(cols):
                col[o] += np.int64(G[r, o])
        for o in range(cols):
            t = np.float64(col[o]) * p
            if t > limit:
                t = limit
            if t < -limit:
                t = -limit
            t = t + 0.5
            t = np.floor(t)
            dst[o] += np.int64(t)
    return True


def _nb_wgrad_prep(G, A, eg, ex, frac_bits, limit, b, scale_a, out):
    """For the folded weight gradient (see _weight_grad), k_j = eg_j + ex_j + S. When it
    folds (kmin >= 0 and b * 127**2 * 2**kmax <= L: every fixed-point value is the exact
    integer dW_j * 2**k_j), write A's rows (scale_a) or G's rows of micro-batch j times
    2**(k_j - kmin) to out (float32, exact: |values| <= 127 * 2**51) and return (bound,
    kmin), bound >= the sum of |terms| of every element of the folded G^T A, so >= every
    partial sum in any order. Else (-1, 0).

    bound = min over the two operands: max over G's columns o of sum_j 2**(k_j - kmin) *
    (sum of |G| in column o over j's rows) * max|A_j|, and the same with A and G swapped.
    All values are integers; float64 sums of them are exact below 2**53, and where one
    rounds the value is already above 2**53, and rounding is monotone: so comparing the
    bound with 2**24 or 2**53 gives the exact answer."""
    n = eg.shape[0]
    kmin = eg[0] + ex[0] + frac_bits
    kmax = kmin
    for j in range(n):
        kj = eg[j] + ex[j] + frac_bits
        if kj < kmin:
            kmin = kj
        if kj > kmax:
            kmax = kj
    if kmin < 0 or kmax > 60 or float(b * 16129) * math.ldexp(1.0, kmax) > limit:
        return -1.0, np.int64(0)
    og, oa = G.shape[1], A.shape[1]
    colg = np.zeros(og)
    cola = np.zeros(oa)
    tg = np.zeros(og, np.int64)
    ta = np.zeros(oa, np.int64)
    for j in range(n):
        sj = math.ldexp(1.0, eg[j] + ex[j] + frac_bits - kmin)
        s32 = np.float32(sj)
        for o in range(og):
            tg[o] = 0
        for o in range(oa):
            ta[o] = 0
        mg = np.int64(0)
        ma = np.int64(0)
        for r in range(j * b, j * b + b):
            for o in range(og):
                v = np.int64(G[r, o])
                if v < 0:
                    v = -v
                tg[o] += v
                if v > mg:
                    mg = v
            for o in range(oa):
                v = np.int64(A[r, o])
                if v < 0:
                    v = -v
                ta[o] += v
                if v > ma:
                    ma = v
            if scale_a:
                for o in range(oa):
                    out[r, o] = A[r, o] * s32
            else:
                for o in range(og):
                    out[r, o] = G[r, o] * s32
        fa, fg = np.float64(ma), np.float64(mg)
        for o in range(og):
            colg[o] += sj * (np.float64(tg[o]) * fa)
        for o in range(oa):
            cola[o] += sj * (np.float64(ta[o]) * fg)
    bg = 0.0
    for o in range(og):
        if colg[o] > bg:
            bg = colg[o]
    ba = 0.0
    for o in range(oa):
        if cola[o] > ba:
            ba = cola[o]
    return (bg if bg < ba else ba), kmin


def _nb_wgrad_store(t, kmin, dst):
    """dst (flat int64) = t (2-D, exact integers below 2**53) * 2**kmin, exact: the result
    is below 2**51 (the fold's condition)."""
    rows, cols = t.shape
    f = np.int64(1) << kmin
    for i in range(rows):
        for c in range(cols):
            dst[i * cols + c] = np.int64(t[i, c]) * f


def _nb_backward_hidden(dX, a_in, relu, b, eg, ew, eg_out):
    """In place, per micro-batch j: v = dX (exact integers), 0 where relu and a_in <= 0;
    s = max(0, bitlen(max|v|) - 7); dX = clamp(round-shift(v, s), -127, 127);
    eg_out[j] = eg[j] + ew + s."""
    n = eg.shape[0]
    cols = dX.shape[1]
    zero = np.zeros(cols, np.int64)
    for j in range(n):
        am = np.int64(0)
        for r in range(j * b, j * b + b):
            for c in range(cols):
                v = np.int64(dX[r, c])
                if relu:
                    if not (a_in[r, c] > 0.0):
                        v = 0
                    dX[r, c] = v
                if v < 0:
                    v = -v
                if v > am:
                    am = v
        eg_out[j] = eg[j] + ew + _nb_shift_rows(dX, zero, j * b, j * b + b, am, -127)


class _Kernels:
    """The compiled kernels, by name without the ``_nb_`` prefix."""


_compiled = None
_compile_lock = threading.Lock()


def compiled_state():
    """None before the kernels were asked for, else what that gave (a _Kernels, or False)."""
    return _compiled


def compiled():
    """The compiled kernels (numba, compiled or loaded from its cache on first use), or
    None without numba or with DAISYCHAIN_NO_NUMBA set (the numpy passes give the same bits)."""
    global _compiled
    if _compiled is None:
        if os.environ.get("DAISYCHAIN_NO_NUMBA"):
            return None
        with _compile_lock:
            if _compiled is None:
                _compiled = _compile()
    return _compiled or None


def load_compiled() -> bool:
    """Import numba and load the compiled kernels now, not after COMPILED_AFTER_S (for a
    process that knows it will train long, e.g. a benchmark). False without numba."""
    return compiled() is not None


def _compile():
    """The kernels as compiled functions, or False without numba."""
    jit = numba_jit()
    if jit is None:
        return False
    g = globals()
    for name in ("_nb_bias_acc", "_nb_bitlen", "_nb_dexp", "_nb_shift_rows"):  # helpers, called from kernels
        g[name] = jit(g[name])
    k = _Kernels()
    for name in ("quant_rows", "hidden", "logits", "output_error", "bias_grad",
                 "wgrad_prep", "wgrad_store", "backward_hidden"):
        setattr(k, name, jit(g["_nb_" + name]))
    return k

"""The transformer's compiled route, second part (engine/attnfast.py runs them): the fused
passes, each several numpy rules of engine/norm.py, engine/attention.py, engine/sround.py
and engine/detmath.py in one loop that writes only its result (the two-operand align-add
with an affine's bias, the q/k/v requantize in head order, the logits, the sequence output
error's rounding and zero-sum, the weights' quantize, the weight gradient's shifted sum).
Why their values are the rules': as engine/attnloops.py (integer arithmetic below 2**53,
or the IEEE float64 operations the rule writes, in its order, no fastmath).

:func:`kernels` gives engine/attnloops.py's loops and these in one namespace.
"""

from __future__ import annotations

import math

import numpy as np

from daisychain.compiled import built_once, numba_jit
from daisychain.engine import attnloops as L
from daisychain.engine import sround as _sround

WIDE = L.WIDE
_nb_bitlen = None  # engine/attnloops.py's compiled helper, set by _build before any loop compiles


def _nb_wide_t(m):
    """norm15's shift for max|V| = m (int64): max(0, bitlen(m) - 15)."""
    t = _nb_bitlen(np.float64(m)) - WIDE
    return t if t > 0 else 0


def _nb_term(v, t, up, dn):
    """An operand's term of the align-add: rshift(v, t) (norm15), then * 2**up or rshift by
    dn, as integers ((v + 2**t / 2) >> t, etc.: the numpy rule's exact float64 values)."""
    ht = (np.int64(1) << t) >> 1
    hd = (np.int64(1) << dn) >> 1
    return (((v + ht) >> t << up) + hd) >> dn


def _nb_align2(X, A, bacc, e0, e1, out, e_out):
    """align_add of two operands, X (n, R, C) and A (n, R, C) plus bacc (n, C) per column
    (the affine's bias in accumulator units, integers in float64; a bacc of no columns: no
    bias), exponents e0, e1 (n,): the wide sum into out (n, R, C) (int32: |v| <= 2**15),
    e_out. The values of _nb_align on (X, A + bacc), in three passes that read X and A and
    write only out: the operands' max|.|, the sum's max|.| (norm15's shift t of the sum),
    then the sum shifted by t. No float64 sum is written, nor A + bacc."""
    n, R, C = X.shape
    use_b = bacc.shape[1] > 0
    bi = np.zeros(C, np.int64)
    for i in range(n):
        if use_b:
            for c in range(C):
                bi[c] = np.int64(bacc[i, c])
        m0 = np.int64(0)
        m1 = np.int64(0)
        for r in range(R):
            for c in range(C):
                a = np.int64(X[i, r, c])
                a = a if a >= 0 else -a
                m0 = a if a > m0 else m0
                b = np.int64(A[i, r, c]) + bi[c]
                b = b if b >= 0 else -b
                m1 = b if b > m1 else m1
        t0, t1 = _nb_wide_t(m0), _nb_wide_t(m1)
        w0, w1 = e0[i] + t0, e1[i] + t1
        if m0 > 0 and m1 > 0:
            hi, lo = max(w0, w1), min(w0, w1)
            e = max(lo, hi - 16)
        elif m1 > 0:
            e = w1
        else:
            e = w0
        d0, d1 = w0 - e, w1 - e
        up0 = min(d0, 16) if d0 >= 0 else 0
        dn0 = min(-d0, 40) if d0 < 0 else 0
        up1 = min(d1, 16) if d1 >= 0 else 0
        dn1 = min(-d1, 40) if d1 < 0 else 0
        m = np.int64(0)
        for r in range(R):
            for c in range(C):
                v = (_nb_term(np.int64(X[i, r, c]), t0, up0, dn0)
                     + _nb_term(np.int64(A[i, r, c]) + bi[c], t1, up1, dn1))
                v = v if v >= 0 else -v
                m = v if v > m else m
        t = _nb_wide_t(m)
        h = (np.int64(1) << t) >> 1
        for r in range(R):
            for c in range(C):
                v = (_nb_term(np.int64(X[i, r, c]), t0, up0, dn0)
                     + _nb_term(np.int64(A[i, r, c]) + bi[c], t1, up1, dn1))
                out[i, r, c] = (v + h) >> t
        e_out[i] = e + t


def _nb_logits(acc, bacc, p, z):
    """The output layer's logits: z = (acc + bacc) * p per micro-batch (acc (n, R, C) the
    GEMM's int32 sums, bacc (n, C) integers in float64, p = 2**sexp): the numpy rule's
    float64 sum (exact: an integer below 2**31) and its one IEEE multiply."""
    n, R, C = acc.shape
    bi = np.empty(C, np.int64)
    for i in range(n):
        for c in range(C):
            bi[c] = np.int64(bacc[i, c])
        pi = p[i]
        for r in range(R):
            for c in range(C):
                z[i, r, c] = np.float64(np.int64(acc[i, r, c]) + bi[c]) * pi


def _nb_bias_rq8_heads(acc, c0, bacc, out, e, e_out):
    """_nb_bias_rq8 (no ReLU) of the columns c0 .. c0 + D of acc (n, R, W) int32 (the q, k, v
    GEMM's sums, W = 3D), written in head order as float32 (the per-head GEMMs' operand):
    R = b*T, D = H*dh; out (n, b, H, T, dh), row s*T + t, column h*dh + k -> [s, h, t, k]
    (attention._heads). max|acc + bias| in int32 (the affine's bound: |acc| + 2**30 <
    2**31, layer_base.MAX_FEATURES), the rounding shift in int64."""
    n, R = acc.shape[0], acc.shape[1]
    _, b, H, T, dh = out.shape
    D = H * dh
    b32 = np.empty(D, np.int32)
    bi = np.empty(D, np.int64)
    for i in range(n):
        for o in range(D):
            bi[o] = np.int64(bacc[i, o])
            b32[o] = np.int32(bi[o])
        m = np.int32(0)
        for r in range(R):
            row = acc[i, r, c0:c0 + D]
            for o in range(D):
                v = row[o] + b32[o]
                v = v if v >= 0 else -v
                m = v if v > m else m
        s = _nb_bitlen(np.float64(m)) - 7
        if s < 0:
            s = 0
        half = (np.int64(1) << s) >> 1
        for s_ in range(b):
            for h in range(H):
                bb = bi[h * dh:h * dh + dh]
                for t in range(T):
                    row = acc[i, s_ * T + t, c0 + h * dh:c0 + h * dh + dh]
                    o8 = out[i, s_, h, t]
                    for k in range(dh):
                        x = (np.int64(row[k]) + bb[k] + half) >> s
                        o8[k] = np.float32(min(max(x, -127), 127))
        e_out[i] = e[i] + s


def _nb_shift_add(dW, k, out):
    """out += dW * 2**k as int64 (dW (M, N) the weight gradient GEMM's int32 sums, k >= 0: the
    fixed-point values of exact terms, fold_grad's)."""
    M, N = dW.shape
    for m in range(M):
        for c in range(N):
            out[m * N + c] += np.int64(dW[m, c]) << k


def _nb_quant_w(W, out):
    """detmath.quantize of a weight tensor W (flat, float64) with its own exponent
    quant_exponent(max|W|): ew = bitlen(m) - 7 (0 for m == 0), out = clamp(floor(W *
    2**-ew + 1/2), -127, 127) int8 (the same IEEE multiply, add and floor); returns ew, or
    -2**40 where W holds inf or NaN."""
    m = 0.0
    for k in range(W.shape[0]):
        a = abs(W[k])
        if not (a < np.inf):
            return -(1 << 40)  # inf or NaN: the caller takes the numpy rules
        m = a if a > m else m
    ew = _nb_bitlen(m) - 7 if m > 0.0 else 0
    p = math.ldexp(1.0, -ew)
    for k in range(W.shape[0]):
        v = np.floor(W[k] * p + 0.5)
        out[k] = min(max(v, -127.0), 127.0)
    return ew


def _nb_heads(M, out):
    """attention._heads as float32: M (n, b, T, H, dh) integers (rows s*T + t, column h*dh +
    k) -> out (n, b, H, T, dh)."""
    n, b, T, H, dh = M.shape
    for i in range(n):
        for s_ in range(b):
            for h in range(H):
                for t in range(T):
                    src = M[i, s_, t, h]
                    dst = out[i, s_, h, t]
                    for k in range(dh):
                        dst[k] = np.float32(src[k])


# prng.mix32 in uint64 arithmetic: engine/sround.py's one source (its compiled loop uses it
# too), compiled here with these loops (its Python function, whether or not sround compiled it)
_nb_mix32 = getattr(_sround._nb_mix32, "py_func", _sround._nb_mix32)


def _nb_row_keys(x, y, keys):
    """sround.row_keys: x (n, b, T) token ids, y (n, b) labels -> keys (n, b*T) uint32."""
    n, b, T = x.shape
    m = np.uint64(0xFFFFFFFF)
    for i in range(n):
        for s_ in range(b):
            h = np.uint64(0)
            for t in range(T + 1):
                v = np.uint64(np.uint32(x[i, s_, t] if t < T else y[i, s_]))
                h = _nb_mix32(((h + np.uint64(0x9E3779B9)) & m) ^ v)
            for t in range(T):
                keys[i, s_ * T + t] = _nb_mix32(h ^ ((np.uint64(t) * np.uint64(0x85EBCA6B)) & m))


def _nb_seq_errors(dz, keys, y, G, eg):
    """sround.quantize_errors then detmath.zero_sum_errors in one pass per row: dz (n, R, C)
    float64 (the output error), keys (n, R) the row keys, y (n, R) the targets; G (n, R, C)
    int8, eg (n,). eg = quant_exponent(max|dz|); q = clamp(floor(dz * 2**-eg + u), -127,
    127) with u = mix32((key + c * 0x9E3779B9) mod 2**32) * 2**-32 (the same IEEE multiply,
    add and floor); then per row s = the sum of the entries other than y's: G[y] = max(-s,
    -127), and where s > 127 the excess is taken off the others one unit at a time from
    the largest (the lowest class on a tie), as zero_sum_errors."""
    n, R, C = dz.shape
    m32 = np.uint64(0xFFFFFFFF)
    for i in range(n):
        m = 0.0
        for r in range(R):
            for c in range(C):
                a = abs(dz[i, r, c])
                if a > m:
                    m = a
        e = _nb_bitlen(m) - 7 if m > 0.0 else 0
        eg[i] = e
        scale = math.ldexp(1.0, -e)
        for r in range(R):
            kr = np.uint64(keys[i, r])
            yr = y[i, r]
            s = 0
            for c in range(C):
                u = _nb_mix32((kr + np.uint64(c) * np.uint64(0x9E3779B9)) & m32)
                v = dz[i, r, c] * scale
                v = v + np.float64(u) * 2.3283064365386963e-10
                v = np.floor(v)
                v = min(max(v, -127.0), 127.0)
                q = np.int64(v)
                G[i, r, c] = q
                if c != yr:
                    s += q
            G[i, r, yr] = max(-s, -127)
            for _ in range(s - 127):  # the trim (none where s <= 127)
                best = -1
                for c in range(C):
                    if c != yr and (best < 0 or G[i, r, c] > G[i, r, best]):
                        best = c
                G[i, r, best] -= 1


def _nb_bias_acc(bias, sexp, bacc):
    """bacc[i] = clamp(floor(bias * 2**-sexp[i] + 1/2), -2**30, 2**30) (the affine's bias in
    accumulator units, layer_base's rule: one IEEE multiply, add and floor)."""
    for i in range(sexp.shape[0]):
        p = math.ldexp(1.0, -sexp[i])
        for o in range(bias.shape[0]):
            v = np.floor(bias[o] * p + 0.5)
            bacc[i, o] = min(max(v, -1073741824.0), 1073741824.0)


_NAMES = ("wide_t", "term", "align2", "logits", "bias_rq8_heads", "shift_add", "quant_w", "heads", "mix32",
          "row_keys", "seq_errors", "bias_acc")


def _build():
    """attnloops' loops and these, compiled, in one namespace; None without numba."""
    base = L.kernels()
    jit = numba_jit()
    if base is None or jit is None:
        return None
    g = globals()
    g["_nb_bitlen"] = L._nb_bitlen  # compiled by L.kernels()
    k = type(base)(**vars(base))
    for name in _NAMES:  # every global replaced before any compiles
        g["_nb_" + name] = jit(g["_nb_" + name])
        setattr(k, name, g["_nb_" + name])
    return k


kernels = built_once(_build)

"""The compiled loops of the transformer's route (engine/attnfast.py runs them): one loop per
rule of engine/norm.py and engine/attention.py, or per pass of several rules, with the
numpy rules' values.

Why the values are the same: every rule is either integer arithmetic (int64, every value
below 2**53 as docs/ENGINE.md bounds it: exact in any order; a numpy rule's rounding shift
floor(v * 2**-s + 1/2) on integers held in float64 is the integer (v + 2**(s-1)) >> s) or
the IEEE float64 operations the numpy rule writes, in the order it writes them (numba
without fastmath: no fused multiply-add, no reordering). ``math.frexp`` gives numpy's
exponent, ``math.sqrt`` is correctly rounded as ``np.sqrt``.
"""

from __future__ import annotations

import math
import types

import numpy as np

from daisychain.compiled import built_once, numba_jit
from daisychain.engine import norm as N

WIDE, F = N.WIDE_BITS, N.NORM_F


# ---------------------------------------------------------------------- the loops
def _nb_bitlen(m):
    """numpy's frexp exponent of float64 m >= 0 (0 for 0)."""
    if m == 0.0:
        return 0
    return math.frexp(m)[1]


def _nb_absmax(V, i):
    """max|V[i]| of integers (held in any dtype, |V| < 2**53) as int64: integer compares,
    which the compiler vectorizes."""
    m = np.int64(0)
    for k in range(V.shape[1]):
        a = np.int64(V[i, k])
        a = a if a >= 0 else -a
        m = a if a > m else m
    return m


def _nb_rq8(V, am, e, out, e_out):
    """_rq8 on V (n, L) (integers, |V| < 2**53) given am = max|V| per micro-batch (taken here
    where am[i] < 0): s = max(0, bitlen(am) - 7), out = clamp(floor(V * 2**-s + 1/2), -127,
    127) (the requantize by arithmetic), computed as the integer (V + 2**s / 2) >> s (floor
    division by 2**s: the same integer), e_out = e + s."""
    n, L = V.shape
    for i in range(n):
        if am[i] < 0.0:
            am[i] = np.float64(_nb_absmax(V, i))
        s = _nb_bitlen(np.float64(am[i])) - 7
        if s < 0:
            s = 0
        half = (np.int64(1) << s) >> 1
        for k in range(L):
            x = (np.int64(V[i, k]) + half) >> s
            x = min(max(x, -127), 127)
            out[i, k] = x
        e_out[i] = e[i] + s


def _nb_norm15(V, e, e_out):
    """norm15 in place on V (n, L) float64 integers: t = max(0, bitlen(max|V|) - 15) per
    micro-batch; where any t > 0 every micro-batch takes floor(V * 2**-t + 1/2) (as numpy's
    one pass), here the integer (V + 2**t / 2) >> t (the same value)."""
    n, L = V.shape
    ts = np.empty(n, np.int64)
    anyt = False
    for i in range(n):
        t = _nb_bitlen(np.float64(_nb_absmax(V, i))) - WIDE
        if t < 0:
            t = 0
        ts[i] = t
        e_out[i] = e[i] + t
        if t > 0:
            anyt = True
    if anyt:
        for i in range(n):
            t = ts[i]
            h = (np.int64(1) << t) >> 1
            for k in range(L):
                V[i, k] = np.float64((np.int64(V[i, k]) + h) >> t)


def _nb_align(ops, es, S, e_out):
    """align_add of the k operands ops (a tuple of (n, L) arrays of integers below 2**53, left
    as they are) with exponents es (k, n): S (n, L), e_out (n,). The numpy rule's values,
    in integers (a rounding shift floor(w * 2**-k + 1/2) is (w + 2**k / 2) >> k, a shift up
    by d <= 16 is w << d: every value exact below 2**53 in both): each
    operand's wide form w (norm15: t > 0 only where max|V| >= 2**15, so w is non-zero exactly
    where V is) is taken as its term is, the terms summed in operand order, then norm15."""
    k = len(ops)
    n, L = S.shape
    ts = np.zeros((k, n), np.int64)
    ew = np.empty((k, n), np.int64)
    nz = np.zeros((k, n), np.bool_)
    anyt = np.zeros(k, np.bool_)
    for o in range(k):
        for i in range(n):
            m = np.float64(_nb_absmax(ops[o], i))
            t = _nb_bitlen(m) - WIDE
            if t < 0:
                t = 0
            ts[o, i] = t
            ew[o, i] = es[o, i] + t
            nz[o, i] = m > 0.0
            if t > 0:
                anyt[o] = True
    for i in range(n):
        hi, lo, live = 0, 0, False
        for o in range(k):
            if nz[o, i]:
                if not live:
                    hi, lo, live = ew[o, i], ew[o, i], True
                else:
                    hi = max(hi, ew[o, i])
                    lo = min(lo, ew[o, i])
        e = max(lo, hi - 16) if live else ew[0, i]
        for o in range(k):
            V = ops[o]
            tt = ts[o, i] if anyt[o] else 0  # norm15's shift (0: none)
            ht = (np.int64(1) << tt) >> 1
            d = ew[o, i] - e
            up = min(d, 16) if d >= 0 else 0
            dn = min(-d, 40) if d < 0 else 0
            hd = (np.int64(1) << dn) >> 1
            if o == 0:
                for l in range(L):
                    S[i, l] = np.float64((((np.int64(V[i, l]) + ht) >> tt << up) + hd) >> dn)
            else:
                for l in range(L):
                    S[i, l] += np.float64((((np.int64(V[i, l]) + ht) >> tt << up) + hd) >> dn)
        e_out[i] = e
    e2 = e_out.copy()
    _nb_norm15(S, e2, e_out)


def _nb_isqrt(v):
    q = np.int64(math.floor(math.sqrt(float(v))))
    if q * q > v:
        q -= 1
    if (q + 1) * (q + 1) <= v:
        q += 1
    return q


def _nb_fdiv(p, d, inv):
    """floor(p / d) for integers 0 <= p < 2**52, d > 0, with inv = 1.0 / d (one division per
    row, not per value): p * inv is p / d within a relative 2**-52, so less than 1 away and
    its floor is floor(p / d) or one off either way, which r * d > p and (r + 1) * d <= p
    correct (exact int64 products: r * d <= p + d)."""
    r = np.int64(math.floor(np.float64(p) * inv))
    if r * d > p:
        r -= 1
    elif (r + 1) * d <= p:
        r += 1
    return r


def _nb_sdiv_r(a, m, inv):
    """sign(a) * floor((2|a| + m) / (2m)) (norm.sdiv), m > 0, for |a| < 2**48 and m < 2**32
    (the norm's bounds, docs/ENGINE.md), with inv = 1.0 / (2m) taken once per row
    (_nb_fdiv: no hardware division per value)."""
    r = _nb_fdiv(2 * abs(a) + m, 2 * m, inv)
    return r if a > 0 else (-r if a < 0 else 0 * r)


def _nb_rms_fwd(x, C, y, q, j, am):
    """rms_forward on x (n, R, D) integers (int32 or float64): y (n, R, D) (int32: |y| <=
    C + 1), q, j (n, R) int64, and am (n,) = max|y| per micro-batch (the requantize's)."""
    n, R, D = x.shape
    xs = np.empty(D, np.int64)
    for i in range(n):
        my = np.int64(0)
        for r in range(R):
            m = 0
            for c in range(D):
                v = np.int64(x[i, r, c])
                xs[c] = v
                if abs(v) > m:
                    m = abs(v)
            jj = 0
            if m > 0:
                jj = WIDE - _nb_bitlen(float(m))
                if jj < 0:
                    jj = 0
            ss = 0
            for c in range(D):
                xs[c] = xs[c] << jj
                ss += xs[c] * xs[c]
            qq = _nb_isqrt(ss)
            j[i, r], q[i, r] = jj, qq
            inv = 1.0 / np.float64(2 * qq) if qq > 0 else 0.0
            yr = y[i, r]
            if qq > 0 and m <= 32768 and C <= 32768:
                # sdiv(a, q) = sign(a) * floor((2|a| + q) / (2q)) as one float64 division
                # floored: 2|a| + q < 2**32, 2q <= 2**22 and the quotient below 2**16, so
                # its rounding error (< 2**-37) is smaller than the 1 / (2q) a quotient
                # that is not an integer lies from the next one: the integer division's
                fq, d = np.float64(qq), np.float64(2 * qq)
                for c in range(D):
                    a = xs[c] * C
                    v = np.int64(np.floor((np.float64(2 * (a if a >= 0 else -a)) + fq) / d))
                    v = v if a >= 0 else -v
                    yr[c] = v
                    v = v if v >= 0 else -v
                    my = v if v > my else my
            else:
                for c in range(D):
                    v = _nb_sdiv_r(xs[c] * C, qq, inv) if qq > 0 else 0
                    yr[c] = v
                    v = v if v >= 0 else -v
                    my = v if v > my else my
        am[i] = np.float64(my)


def _nb_rms_back(g, y, q, j, C, dx):
    """rms_backward's dx before its norm15, on int8 errors g (n, R, D) float64: dx float64;
    returns J per micro-batch (n,) int64."""
    n, R, D = g.shape
    Nn = np.int64(D) << (2 * F)
    Js = np.zeros(n, np.int64)
    for i in range(n):
        J, live_any = 0, False
        for r in range(R):
            if q[i, r] > 0:
                if not live_any or j[i, r] > J:
                    J = j[i, r]
                live_any = True
        Js[i] = J
        for r in range(R):
            if q[i, r] <= 0:
                for c in range(D):
                    dx[i, r, c] = 0.0
                continue
            yr, gr, dr = y[i, r], g[i, r], dx[i, r]
            Pr = np.int64(0)
            for c in range(D):
                Pr += np.int64(yr[c]) * np.int64(gr[c])
            Dq = D * q[i, r]
            fq, fd = np.float64(Dq), np.float64(2 * Dq)
            k = J - j[i, r]
            if k > 40:
                k = 40
            half = (np.int64(1) << k) >> 1
            for c in range(D):
                # sdiv(num, Dq) = sign(num) * floor((2|num| + Dq) / (2 Dq)) as one float64
                # division floored: exact for any integer numerator below 2**53 (here
                # < 2**50): a quotient p/d that is not an integer lies at least 1/d below
                # the next one, and the division's rounding error is below p * 2**-53 / d
                num = np.int64(gr[c]) * Nn - np.int64(yr[c]) * Pr
                a = num if num >= 0 else -num
                w = np.int64(np.floor((np.float64(2 * a) + fq) / fd))
                w = w if num >= 0 else -w
                dr[c] = np.float64((w * C + half) >> k)
    return Js


def _nb_softmax(Sc, mult, exp_i, P):
    """softmax_int on Sc (n, B, T, T) (integers, read as float64) with mult = 2**(E + 4) per
    micro-batch and the exp table as int64; P float32 (integers 0..127). The row max and
    the sum S of the table's values in int64 (exact; integer reductions vectorize, float
    ones do not without fastmath); P = floor((256 e + S) / (2 S)) as one float64 division
    floored: both operands are integers below 2**45 (S <= context * 2**31 < 2**40) and the
    quotient is below 2**8, so a quotient that is not an integer lies at least 1 / (2 S) >
    2**-41 from the next one while the division's rounding error is below 2**-44: the floor
    is the integer division's (numpy's idiv)."""
    n, B, T, _ = Sc.shape
    ev = np.empty(T, np.int64)
    for i in range(n):
        mu = mult[i]
        for b in range(B):
            for t in range(T):
                row = Sc[i, b, t]
                mi = np.int64(row[0])
                for u in range(1, t + 1):
                    v = np.int64(row[u])
                    mi = v if v > mi else mi
                m = np.float64(mi)
                S = np.int64(0)
                for u in range(t + 1):
                    z = np.floor((np.float64(row[u]) - m) * mu + 0.5)
                    z = z if z > -128.0 else -128.0
                    e = exp_i[np.int64(z) + 128]
                    ev[u] = e
                    S += e
                d = np.float64(2 * S)
                fs = np.float64(S)
                out = P[i, b, t]
                for u in range(t + 1):
                    q = np.floor((256.0 * np.float64(ev[u]) + fs) / d)
                    out[u] = np.float32(q if q < 127.0 else 127.0)
                for u in range(t + 1, T):
                    out[u] = 0.0


def _nb_softmax_back(P, dP, out):
    """softmax_back on (B, T, T): out = P * (128 dP - rho), rho = sum_u P dP."""
    B, T, U = P.shape
    for b in range(B):
        for t in range(T):
            rho = 0
            for u in range(U):
                rho += np.int64(P[b, t, u]) * np.int64(dP[b, t, u])
            for u in range(U):
                p = np.int64(P[b, t, u])
                out[b, t, u] = float(p * (128 * np.int64(dP[b, t, u]) - rho))


def _nb_accum(dW, p, limit, out):
    """out += sum over micro-batches i of floor(clamp(dW_i * p_i, -limit, limit) + 1/2), the
    engine's _accumulate (dW (n, M) integers, read as float64; p_i = 2**(e_i + S))."""
    n, M = dW.shape
    for m in range(M):
        acc = 0
        for i in range(n):
            x = np.float64(dW[i, m]) * p[i]
            x = min(x, limit)
            x = max(x, -limit)
            x += 0.5
            acc += np.int64(math.floor(x))
        out[m] += acc


def _nb_bias_max(acc, bacc, i, bi):
    """bi = micro-batch i's bias as int64; returns max|acc[i] + bi| (int64)."""
    R, O = acc.shape[1], acc.shape[2]
    for o in range(O):
        bi[o] = np.int64(bacc[i, o])
    m = np.int64(0)
    for r in range(R):
        for o in range(O):
            v = np.int64(acc[i, r, o]) + bi[o]
            v = v if v >= 0 else -v
            m = v if v > m else m
    return m


def _nb_bias_add(acc, bacc, out, am):
    """out = acc + bacc per micro-batch (acc (n, R, O) the GEMM's integer sums, bacc (n, O)
    integers below 2**30 in float64: the float64 sum of the numpy rule is exact, so it is
    the int64 sum) and am = max|out| per micro-batch (the requantize's, of the same values)."""
    n, R, O = acc.shape
    bi = np.empty(O, np.int64)
    for i in range(n):
        am[i] = np.float64(_nb_bias_max(acc, bacc, i, bi))
        for r in range(R):
            for o in range(O):
                out[i, r, o] = np.float64(np.int64(acc[i, r, o]) + bi[o])


def _nb_bias_rq8(acc, bacc, lo, out, e, e_out):
    """_nb_bias_add then _nb_rq8 in one: out = clamp((v + 2**s / 2) >> s, lo, 127) int8 with
    v = acc + bacc (the affine's integer sums), s = max(0, bitlen(max|v|) - 7) per
    micro-batch, e_out = e + s; lo = 0 is the ReLU after it (max(q, 0)), else -127."""
    n, R, O = acc.shape
    bi = np.empty(O, np.int64)
    for i in range(n):
        s = _nb_bitlen(np.float64(_nb_bias_max(acc, bacc, i, bi))) - 7
        if s < 0:
            s = 0
        half = (np.int64(1) << s) >> 1
        for r in range(R):
            for o in range(O):
                x = (np.int64(acc[i, r, o]) + bi[o] + half) >> s
                out[i, r, o] = min(max(x, lo), 127)
        e_out[i] = e[i] + s


def _nb_rq8x(V, mask, am, e, out, e_out, sums):
    """_nb_rq8 on V (n, R, C) with two passes folded in: where mask.shape[0] > 0, V * (mask >
    0) first (the ReLU's error mask); where sums.shape[0] > 0, sums (n, C) = the int8 out's
    sum over R (the bias gradient's integers)."""
    n, R, C = V.shape
    use_mask, want = mask.shape[0] > 0, sums.shape[0] > 0
    for i in range(n):
        if am[i] < 0.0:
            m = np.int64(0)
            for r in range(R):
                for c in range(C):
                    a = np.int64(V[i, r, c])
                    if use_mask and mask[i, r, c] <= 0:
                        a = 0
                    a = a if a >= 0 else -a
                    m = a if a > m else m
            am[i] = np.float64(m)
        s = _nb_bitlen(am[i]) - 7
        if s < 0:
            s = 0
        half = (np.int64(1) << s) >> 1
        if want:
            for c in range(C):
                sums[i, c] = 0
        for r in range(R):
            for c in range(C):
                v = np.int64(V[i, r, c])
                if use_mask and mask[i, r, c] <= 0:
                    v = 0
                x = min(max((v + half) >> s, -127), 127)
                out[i, r, c] = x
                if want:
                    sums[i, c] += x
        e_out[i] = e[i] + s


def _nb_rq8_rows(V, e, out, e_out, sums):
    """_nb_rq8x of attention._rows(V): V (n, b, H, T, dh) in head order, out (n, b*T, H*dh)
    in row order (row s*T + t, column h*dh + k), sums as _nb_rq8x's."""
    n, b, H, T, dh = V.shape
    want = sums.shape[0] > 0
    for i in range(n):
        m = np.int64(0)
        for s_ in range(b):
            for h in range(H):
                for t in range(T):
                    for k in range(dh):
                        a = np.int64(V[i, s_, h, t, k])
                        a = a if a >= 0 else -a
                        m = a if a > m else m
        s = _nb_bitlen(np.float64(m)) - 7
        if s < 0:
            s = 0
        half = (np.int64(1) << s) >> 1
        if want:
            for c in range(H * dh):
                sums[i, c] = 0
        for s_ in range(b):
            for h in range(H):
                for t in range(T):
                    for k in range(dh):
                        x = min(max((np.int64(V[i, s_, h, t, k]) + half) >> s, -127), 127)
                        out[i, s_ * T + t, h * dh + k] = x
                        if want:
                            sums[i, h * dh + k] += x
        e_out[i] = e[i] + s


def _nb_scatter(tokens, G, dE):
    """dE[i, tokens[i, r]] += int64(G[i, r]) (the embedding's np.add.at: integers, exact)."""
    n, R, D = G.shape
    for i in range(n):
        for r in range(R):
            v = tokens[i, r]
            for c in range(D):
                dE[i, v, c] += np.int64(G[i, r, c])


_NAMES = ("bitlen", "absmax", "bias_max", "scatter", "fdiv", "sdiv_r", "bias_rq8", "rq8x", "rq8_rows", "rq8",
          "norm15", "align", "isqrt", "rms_fwd", "rms_back", "softmax", "softmax_back", "accum", "bias_add")


def _build():
    """The compiled loops, or None without numba (the numpy rules run)."""
    jit = numba_jit()
    if jit is None:
        return None
    k = types.SimpleNamespace()
    g = globals()
    for name in _NAMES:  # every global replaced before any compiles: the loops
        g["_nb_" + name] = jit(g["_nb_" + name])  # call the compiled helpers
        setattr(k, name, g["_nb_" + name])
    return k


kernels = built_once(_build)

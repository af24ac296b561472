"""The transformer's compiled rules (issue 37): the same values as the numpy rules of
engine/norm.py and engine/attention.py (the definition), one compiled loop per rule instead
of a dozen numpy calls on small arrays.

The block (engine/attention.py) takes its per-row rules from ``eng.attn_ops``: this module's
:class:`AttnOps` when engine/model.py chose it (the "fast" GEMM route, tables equal to their
definitions, numba present); ``None`` takes the numpy rules. The route also runs the
block's 2-D GEMMs (and the output layer's forward) as torch's exact int8 x int8 -> int32
``_int_mm``, its per-head GEMMs as one torch float32 batched matmul each (int8 operands,
K <= 1024: every value an integer below 2**24), each weight gradient as the engine's
literal route (one exact GEMM per micro-batch, then the fixed-point sum of ``_accumulate``
as a loop), the affine's bias add as one loop, and the output error as engine/kernels.py's
compiled loss. The requantize writes int8.

Why the values are the same: every rule is either integer arithmetic (int64, every value
below 2**53 as docs/ENGINE.md bounds it: exact in any order; a numpy rule's rounding shift
floor(v * 2**-s + 1/2) on integers held in float64 is the integer (v + 2**(s-1)) >> s) or
the IEEE float64 operations the numpy rule writes, in the order it writes them (numba
without fastmath: no fused multiply-add, no reordering). ``math.frexp`` gives numpy's exponent, ``math.sqrt`` is
correctly rounded as ``np.sqrt``. tests/engine/test_attnfast.py holds both routes to the
same bytes on every intermediate and on the gradient.
"""

from __future__ import annotations

import math
import threading
import types

import numpy as np

from daisychain.compiled import numba_jit
from daisychain.engine import norm as N
from daisychain.engine.detmath import pow2, quant_exponent, quantize
from daisychain.units.gemm import MAX_K_FLOAT32

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


def _nb_sdiv(a, m):
    """sign(a) * floor((2|a| + m) / (2m)), m > 0, for |a| < 2**48 and m < 2**32 (the norm's
    bounds, docs/ENGINE.md): p = 2|a| + m and d = 2m are exact in float64, the IEEE quotient
    floored is floor(p / d) or one more (rounding is monotone and floor(p / d) is a double),
    and r * d > p says which: the integer division's value without a hardware division."""
    p = 2 * abs(a) + m
    d = 2 * m
    r = np.int64(math.floor(np.float64(p) / np.float64(d)))
    if r * d > p:
        r -= 1
    return r if a > 0 else (-r if a < 0 else 0 * r)


def _nb_rms_fwd(x, C, y, q, j):
    """rms_forward on x (n, R, D) float64 integers: y (n, R, D), q, j (n, R) int64."""
    n, R, D = x.shape
    xs = np.empty(D, np.int64)
    for i in range(n):
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
            for c in range(D):
                y[i, r, c] = _nb_sdiv(xs[c] * C, qq) if qq > 0 else 0


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
            Pr = 0
            for c in range(D):
                Pr += y[i, r, c] * np.int64(g[i, r, c])
            Dq = D * q[i, r]
            k = J - j[i, r]
            if k > 40:
                k = 40
            half = (np.int64(1) << k) >> 1
            for c in range(D):
                num = np.int64(g[i, r, c]) * Nn - y[i, r, c] * Pr
                z = _nb_sdiv(num, Dq) * C
                dx[i, r, c] = float((z + half) >> k)
    return Js


def _nb_softmax(Sc, mult, exp_t, P):
    """softmax_int on Sc (n, B, T, T) (integers, read as float64) with mult = 2**(E + 4) per
    micro-batch; P float32 (integers 0..127)."""
    n, B, T, _ = Sc.shape
    ev = np.empty(T, np.int64)
    for i in range(n):
        mu = mult[i]
        for b in range(B):
            for t in range(T):
                m = np.float64(Sc[i, b, t, 0])
                for u in range(1, t + 1):
                    if np.float64(Sc[i, b, t, u]) > m:
                        m = np.float64(Sc[i, b, t, u])
                S = 0
                for u in range(t + 1):
                    z = math.floor((np.float64(Sc[i, b, t, u]) - m) * mu + 0.5)
                    if z < -128.0:
                        z = -128.0
                    ev[u] = np.int64(exp_t[np.int64(z + 128.0)])
                    S += ev[u]
                for u in range(t + 1):
                    P[i, b, t, u] = float(min(127, (256 * ev[u] + S) // (2 * S)))
                for u in range(t + 1, T):
                    P[i, b, t, u] = 0.0


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


def _nb_bias_add(acc, bacc, out, am):
    """out = acc + bacc per micro-batch (acc (n, R, O) the GEMM's integer sums, bacc (n, O)
    integers below 2**30 in float64: the float64 sum of the numpy rule is exact, so it is
    the int64 sum) and am = max|out| per micro-batch (the requantize's, of the same values)."""
    n, R, O = acc.shape
    bi = np.empty(O, np.int64)
    for i in range(n):
        for o in range(O):
            bi[o] = np.int64(bacc[i, o])
        m = np.int64(0)
        for r in range(R):
            for o in range(O):
                v = np.int64(acc[i, r, o]) + bi[o]
                out[i, r, o] = np.float64(v)
                v = v if v >= 0 else -v
                m = v if v > m else m
        am[i] = np.float64(m)


_NAMES = ("bitlen", "absmax", "rq8", "norm15", "align", "isqrt", "sdiv", "rms_fwd", "rms_back", "softmax",
          "softmax_back", "accum", "bias_add")
_KERN: list = []
_LOCK = threading.Lock()


def kernels():
    """The compiled loops, or None without numba (the numpy rules run)."""
    if _KERN:
        return _KERN[0]
    with _LOCK:
        if not _KERN:
            jit = numba_jit()
            if jit is None:
                _KERN.append(None)
            else:
                k = types.SimpleNamespace()
                g = globals()
                for name in _NAMES:  # every global replaced before any compiles: the loops
                    g["_nb_" + name] = jit(g["_nb_" + name])  # call the compiled helpers
                    setattr(k, name, g["_nb_" + name])
                _KERN.append(k)
    return _KERN[0]


# ---------------------------------------------------------------------- the routes
def _f64(a):
    return np.ascontiguousarray(a, np.float64)


_TORCH: list = []


def _torch():
    if not _TORCH:
        import torch

        _TORCH.append(torch)
    return _TORCH[0]


def _mm2(a, b):
    """a @ b for 2-D integer-valued a (M, K), b (K, N), |values| <= 127, K <= MAX_K_FLOAT32:
    torch's exact int8 x int8 -> int32 GEMM (``_int_mm``, ~2x its float32 GEMM on these
    shapes, one thread), int32 out; a dimension below 2 takes the float32 GEMM (exact too:
    torch 2.13's ``_int_mm`` misreads a one-row operand, see engine/convfast.py)."""
    t = _torch()
    if min(a.shape[0], a.shape[1], b.shape[1]) < 2:
        return t.mm(_t32(a), _t32(b)).numpy()
    return t._int_mm(t.from_numpy(_i8(a)), t.from_numpy(_i8(b))).numpy()


def _i8(a):
    a = np.asarray(a)
    return _writable(a if a.dtype == np.int8 else a.astype(np.int8))


def _writable(a):
    return a if a.flags.writeable else a.copy()  # torch.from_numpy warns on a read-only view


def _t32(a):
    """a as a float32 torch tensor (no copy for a float32 array; int8 cast by torch)."""
    t = _torch().from_numpy(_writable(np.asarray(a)))
    return t if t.dtype == _torch().float32 else t.float()


class AttnOps:
    """The compiled route: the numpy rules' signatures and values."""

    def __init__(self, k):
        self.k = k

    def mm(self, eng, a, b):
        """eng._mm's float32 GEMM (int8 operands, K <= MAX_K_FLOAT32: every partial sum an
        integer below 2**24, so exact in torch's order as in BLAS's) without its conversion
        back to float64; a larger K takes eng._mm. torch's one-thread GEMMs are 2-3x numpy's
        on these small shapes (docs/BENCHMARKS.md)."""
        K = a.shape[-1]
        if K > MAX_K_FLOAT32:
            return eng._mm(a, b)
        if b.ndim == 2:
            return _mm2(a.reshape(-1, K), b).reshape(a.shape[:-1] + b.shape[1:])
        return _torch().matmul(_t32(a), _t32(b)).numpy()

    def affine(self, eng, a, ex, W2, bias):
        """layer_base._affine's values (acc = GEMM + bacc, float64) with this route's GEMM and
        the bias added in one compiled pass, which also takes max|acc| per micro-batch for
        the requantize after it: (acc, sexp, Wq, ew, bacc, am)."""
        ew = int(quant_exponent(np.abs(W2).max()))
        Wq = quantize(W2, ew)
        acc32 = self.mm(eng, a, Wq.T)
        sexp = ex + ew
        bacc = np.clip(np.floor(bias[None, :] * pow2(-sexp)[:, None] + 0.5), -2.0**30, 2.0**30)  # BIAS_LIMIT
        acc = np.empty(acc32.shape, np.float64)
        am = np.empty(acc.shape[0], np.float64)
        self.k.bias_add(np.ascontiguousarray(acc32), bacc, acc, am)
        return acc, sexp, Wq, ew, bacc, am

    def weight_grad(self, eng, out, pi, G, a_in, e, frac_bits, limit):
        """eng._weight_grad's literal route (the per-micro-batch GEMM, then _accumulate) where
        a micro-batch's rows fit one exact float32 GEMM; else eng._weight_grad."""
        if G.shape[1] > MAX_K_FLOAT32:
            return eng._weight_grad(out, pi, G, a_in, e, frac_bits, limit)
        dW = np.stack([_mm2(G[i].T, a_in[i]) for i in range(G.shape[0])])
        p = np.ldexp(1.0, np.asarray(e, np.int64) + frac_bits).reshape(-1)
        o = eng.layout.offsets[pi]
        self.k.accum(dW.reshape(dW.shape[0], -1), np.broadcast_to(p, (dW.shape[0],)).copy(), float(limit),
                     out[o:o + dW[0].size])

    def rq8(self, eng, V, e, am=None):
        """(int8, e + s): int8 feeds the exact int8 GEMMs without a cast. ``am``: max|V| per
        micro-batch where the caller has it."""
        V = np.ascontiguousarray(V)
        out = np.empty(V.shape, np.int8)
        e_out = np.empty(V.shape[0], np.int64)
        V2 = V.reshape(V.shape[0], -1)
        am = np.full(V.shape[0], -1.0) if am is None else np.array(am, np.float64)  # -1: the loop takes it
        self.k.rq8(V2, am, np.broadcast_to(np.asarray(e, np.int64), (V.shape[0],)), out.reshape(V.shape[0], -1),
                   e_out)
        return out, e_out

    def align_add(self, ops):
        first = np.asarray(ops[0][0])
        shape, n = first.shape, first.shape[0]
        dts = {np.asarray(V).dtype for V, _ in ops}
        dt = dts.pop() if len(dts) == 1 else np.float64
        # one array type for the tuple: C order, writable (a broadcast view is read-only)
        Vs = tuple(np.require(np.asarray(V, dt).reshape(n, -1), dt, ["C", "W"]) for V, _ in ops)
        es = np.stack([np.broadcast_to(np.asarray(e, np.int64), (n,)) for _, e in ops])
        S = np.empty(Vs[0].shape, np.float64)
        e_out = np.empty(n, np.int64)
        self.k.align(Vs, es, S, e_out)
        return S.reshape(shape), e_out

    def rms_forward(self, x):
        x = _f64(x)
        n, R, D = x.shape
        y = np.empty((n, R, D), np.int64)
        q = np.empty((n, R), np.int64)
        j = np.empty((n, R), np.int64)
        self.k.rms_fwd(x, N.norm_constant(D), y, q, j)
        return y, (y, q, j)

    def rms_backward(self, g, eg, ex, cache):
        y, q, j = cache
        g = _f64(g)
        dx = np.empty(g.shape, np.float64)
        J = self.k.rms_back(g, y, q, j, N.norm_constant(g.shape[-1]), dx)
        e = np.asarray(eg, np.int64) - 3 * F - np.asarray(ex, np.int64) + J
        e_out = np.empty(g.shape[0], np.int64)
        flat = dx.reshape(g.shape[0], -1)
        self.k.norm15(flat, np.broadcast_to(e, (g.shape[0],)).copy(), e_out)
        return dx, e_out

    def softmax_int(self, eng, Sc, E):
        Sc = np.ascontiguousarray(Sc)
        mult = np.ldexp(1.0, np.asarray(E, np.int64) + 4).reshape(-1).astype(np.float64)
        P = np.empty(Sc.shape, np.float32)
        self.k.softmax(Sc, np.broadcast_to(mult, (Sc.shape[0],)).copy(), eng.exp_t, P)
        return P

    def output_error(self, z, y, keys=None):
        """Engine._output_error then the error's quantization per micro-batch for a
        cross-entropy model, by engine/kernels.py's compiled loss (the dense and image paths'
        one: the same float64 operations in the same order): (G float64, eg, loss, correct),
        or None where a kernel's precondition fails (the numpy rules then run)."""
        from daisychain.engine import kernels as shared
        from daisychain.engine.sround import quantize_errors

        base = shared.compiled()
        if base is None:
            return None
        n, b, C = z.shape
        z2 = np.ascontiguousarray(z, np.float64).reshape(n * b, C)
        yv = np.ascontiguousarray(np.asarray(y).reshape(-1), dtype=np.int64)
        dz = np.empty((n, b * C))
        py = np.empty((n, b))
        correct = np.empty(n, np.int64)
        if not base.output_error(z2, yv, b, dz.reshape(n * b, C), py.reshape(-1), correct):
            return None
        loss = -np.log(np.maximum(py, 1e-300)).mean(axis=1)  # display only, as _output_error
        if keys is not None:  # a sequence model's stochastic rounding (engine/sround.py)
            return (*quantize_errors(dz.reshape(n, b, C), keys), loss, correct)
        eg = np.empty(n, np.int64)
        G32 = np.empty((n, b * C), np.float32)
        if not base.quant_rows(dz, G32, eg):
            return None
        return G32.astype(np.float64).reshape(n, b, C), eg, loss, correct

    def softmax_back(self, P, dP):
        P, dP = np.ascontiguousarray(P), np.ascontiguousarray(dP)
        out = np.empty(P.shape, np.float64)
        self.k.softmax_back(P.reshape((-1,) + P.shape[-2:]), dP.reshape((-1,) + dP.shape[-2:]),
                            out.reshape((-1,) + P.shape[-2:]))
        return out


def attn_ops():
    """The compiled route, or None without numba."""
    k = kernels()
    return None if k is None else AttnOps(k)

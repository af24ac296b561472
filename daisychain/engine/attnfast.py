"""The transformer's compiled rules (issue 37): the same values as the numpy rules of
engine/norm.py and engine/attention.py (the definition), one compiled loop per rule instead
of a dozen numpy calls on small arrays.

The block (engine/attention.py) takes its per-row rules from ``eng.attn_ops``: this module's
:class:`AttnOps` when engine/model.py chose it (the "fast" GEMM route, tables equal to their
definitions, numba present); ``None`` takes the numpy rules. The route also runs the
block's 2-D GEMMs (q, k and v as one, and the output layer's) as torch's exact int8 x int8
-> int32 ``_int_mm``, its per-head GEMMs as one torch float32 batched matmul each (int8
operands, K <= 1024: every value an integer below 2**24), each weight gradient as one exact
GEMM per exponent group shifted into the fixed-point sum (or the engine's literal route),
the weights' quantize, ``Engine._accumulate`` and the output layer's logits as one loop
each, and the output error as engine/kernels.py's compiled loss, then one pass for its
stochastic rounding and zero-sum. The residual stream is int32 (|v| <= 2**15); its
two-operand align-adds are one loop that adds the o and fc2 biases itself and writes no
float64 sum. The requantize writes int8, and takes the bias add (q, k, v in head order as
the per-head GEMMs' float32 operand; fc1 with its ReLU), the ReLU's error mask, the
head-to-row order or the bias gradient's sums in the same pass where one comes before or
after it.

The loops are engine/attnloops.py's and engine/attnfused.py's (why their values are the
numpy rules'). tests/engine/test_attnfast.py holds both routes to the same bytes on every
intermediate and on the gradient.
"""

from __future__ import annotations

import numpy as np

from daisychain.engine import int8mm
from daisychain.engine import norm as N
from daisychain.engine.attnfused import kernels
from daisychain.engine.detmath import pow2, quant_exponent, quantize
from daisychain.engine.layer_base import _trace_affine
from daisychain.units.gemm import MAX_K_FLOAT32

F = N.NORM_F


# ---------------------------------------------------------------------- the routes
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
    return int8mm.mm(_i8(a), _i8(b))  # _int_mm, or the float32 GEMM where that is faster


def _per_mb(e, n):
    """An exponent (a scalar or one per micro-batch) as a contiguous int64 (n,) array (what
    np.broadcast_to(...).copy() gave, without its cost on ~60 calls a step)."""
    e = np.asarray(e, np.int64)
    if e.shape == (n,):
        return e if e.flags.c_contiguous else e.copy()
    return np.full(n, e.reshape(-1)[0] if e.size == 1 else e, np.int64)


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
        self._exp = None  # (the engine's exp table, its int64 copy)
        self._norm = {}  # width -> norm.norm_constant(width)

    def _norm_c(self, D):
        """norm.norm_constant(D), taken once per width (an integer square root in numpy)."""
        if D not in self._norm:
            self._norm[D] = N.norm_constant(D)
        return self._norm[D]

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
        if a.ndim == b.ndim == 3:  # bmm: no copy of a transposed operand (matmul makes one)
            return _torch().bmm(_t32(a), _t32(b)).numpy()
        return _torch().matmul(_t32(a), _t32(b)).numpy()

    def _wq(self, W2):
        """The weight's int8 values (|Wq| <= 127: they feed the GEMMs without a cast) and
        exponent, quant_exponent and quantize in one compiled pass."""
        W2 = np.ascontiguousarray(W2, np.float64)
        Wq = np.empty(W2.shape, np.int8)
        ew = int(self.k.quant_w(W2.reshape(-1), Wq.reshape(-1)))
        if ew == -(1 << 40):  # inf or NaN: the numpy rules' values
            ew = int(quant_exponent(np.abs(W2).max()))
            return quantize(W2, ew).astype(np.int8), ew
        return Wq, ew

    def accumulate(self, eng, out, pi, ints, e, frac_bits, limit):
        """Engine._accumulate (the fixed-point sum over micro-batches of clamp-then-round(ints
        * 2**(e + S))) as one compiled loop (_nb_accum, the weight gradient's literal
        route's): the same float64 operations per element, the sum in int64."""
        ints = np.asarray(ints)
        n = ints.shape[0]
        p = np.ldexp(1.0, _per_mb(np.asarray(e, np.int64).reshape(-1), n) + frac_bits)
        o = eng.layout.offsets[pi]
        flat = np.ascontiguousarray(ints).reshape(n, -1)
        self.k.accum(flat, p, float(limit), out[o:o + flat.shape[1]])

    def _bacc(self, bias, sexp):
        """The bias in accumulator units per micro-batch, clamped to BIAS_LIMIT (one loop)."""
        sexp = np.asarray(sexp, np.int64).reshape(-1)
        bias = np.ascontiguousarray(bias, np.float64)
        if not np.isfinite(bias).all() or np.abs(sexp).max() > 1000:  # the numpy rule's values
            return np.clip(np.floor(bias[None, :] * pow2(-sexp)[:, None] + 0.5), -2.0**30, 2.0**30)
        bacc = np.empty((sexp.shape[0], bias.shape[0]))
        self.k.bias_acc(bias, sexp, bacc)
        return bacc

    def _gemm(self, eng, a, ex, W2, bias):
        """The affine's GEMM (int32 sums, C order) and its bias in accumulator units."""
        Wq, ew = self._wq(W2)
        acc32 = np.ascontiguousarray(self.mm(eng, a, Wq.T))
        sexp = ex + ew
        return acc32, sexp, Wq, ew, self._bacc(bias, sexp)

    def logits(self, eng, li, st, W2, bias):
        """The output layer's forward (layers.Linear on the last layer): its GEMM, then the
        bias add and the scaling to float64 logits in one pass (the numpy rule writes the
        float64 sums, then multiplies them); the trace entries as _affine's. Sets
        st.logits; returns (Wq, ew)."""
        acc32, sexp, Wq, ew, bacc = self._gemm(eng, st.a, st.ex, W2, bias)
        z = np.empty(acc32.shape, np.float64)
        self.k.logits(acc32, bacc, pow2(_per_mb(sexp, acc32.shape[0])), z)
        _trace_affine(st, f"layers.{li}", ew, bacc, acc32.astype(np.float64) + bacc[:, None, :] if st.tracing else None)
        st.logits = z
        st.tr(("logits", z))
        return Wq, ew

    def qkv_heads(self, eng, a, ex, P, dims, tracing):
        """The q, k and v affines (P: their weights and biases in turn) as one GEMM of the
        three int8 weights stacked (the same int32 sums per column), then per tensor the
        bias add and requantize in one pass that writes the head-order float32 operand of
        the per-head GEMMs (no int8 rows, no reorder pass): per tensor (heads, e8, Wq, ew,
        bacc, acc), acc (for the trace) only where ``tracing``."""
        n, b, T, H, dh = dims
        if a.shape[-1] > MAX_K_FLOAT32:
            return None  # the per-tensor route (eng._mm's float64 GEMM)
        ws = [self._wq(P[2 * j]) for j in range(3)]
        D = ws[0][0].shape[0]
        acc32 = _mm2(a.reshape(-1, a.shape[-1]), np.concatenate([Wq for Wq, _ in ws]).T).reshape(n, -1, 3 * D)
        acc32 = acc32.astype(np.int32, copy=False)  # a one-row operand's float32 GEMM: the same integers
        out = []
        for j, (Wq, ew) in enumerate(ws):
            sexp = np.asarray(ex, np.int64) + ew
            bacc = self._bacc(P[2 * j + 1], sexp)
            Mh = np.empty((n * b * H, T, dh), np.float32)
            e8 = np.empty(n, np.int64)
            self.k.bias_rq8_heads(acc32, j * D, bacc, Mh.reshape(n, b, H, T, dh), _per_mb(sexp, n), e8)
            acc = acc32[:, :, j * D:(j + 1) * D].astype(np.float64) + bacc[:, None, :] if tracing else None
            out.append((Mh, e8, Wq, ew, bacc, acc))
        return out

    def affine(self, eng, a, ex, W2, bias):
        """layer_base._affine's values (acc = GEMM + bacc, float64) with this route's GEMM and
        the bias added in one compiled pass, which also takes max|acc| per micro-batch for
        the requantize after it: (acc, sexp, Wq, ew, bacc, am)."""
        acc32, sexp, Wq, ew, bacc = self._gemm(eng, a, ex, W2, bias)
        acc = np.empty(acc32.shape, np.float64)
        am = np.empty(acc.shape[0], np.float64)
        self.k.bias_add(acc32, bacc, acc, am)
        return acc, sexp, Wq, ew, bacc, am

    def affine_rq8(self, eng, a, ex, W2, bias, relu, tracing):
        """affine, then rq8 (and the ReLU after it where ``relu``) in one pass that writes the
        int8 rows and never the float64 sums: (q8, e8, Wq, ew, bacc, acc); acc (the sums, for
        the trace) only where ``tracing``, else None."""
        acc32, sexp, Wq, ew, bacc = self._gemm(eng, a, ex, W2, bias)
        q8 = np.empty(acc32.shape, np.int8)
        e8 = np.empty(acc32.shape[0], np.int64)
        self.k.bias_rq8(acc32, bacc, 0 if relu else -127, q8, np.asarray(sexp, np.int64), e8)
        acc = acc32.astype(np.float64) + bacc[:, None, :] if tracing else None
        return q8, e8, Wq, ew, bacc, acc

    def fold_grad(self, eng, out, pi, G, a_in, e, frac_bits, limit):
        """eng._weight_grad's sum where every micro-batch's term is an exact integer (as its
        fast path: k = e + S >= 0 for each, and no element can reach the clamp, |dW| <= b *
        127 * 127): the fixed-point value of micro-batch i is then dW_i * 2**k_i itself, so
        the micro-batches of one k are one exact int8 GEMM over all their rows (int32: n * b
        * 127 * 127 < 2**31), shifted by k and summed in int64. True where it did the sum."""
        n, b = G.shape[0], G.shape[1]
        k = [int(v) + frac_bits for v in np.asarray(e, np.int64).reshape(-1).tolist()]  # Python ints: ~13 calls a step
        k = k * n if len(k) == 1 else k
        if (min(k) < 0 or max(k) > 1000 or float(b) * 16129.0 * 2.0 ** max(k) > limit
                or n * b * 16129 >= 2**31 or G.shape[2] < 2 or a_in.shape[2] < 2):
            return False
        if any(v.dtype != np.int8 and np.abs(v).max() > 127 for v in (G, a_in)):
            return False  # int8 operands only (an output error is int8; checked, not assumed)
        o = eng.layout.offsets[pi]
        size = G.shape[2] * a_in.shape[2]
        for kv in sorted(set(k)):
            sel = slice(None) if min(k) == max(k) else [i for i, v in enumerate(k) if v == kv]
            dW = _mm2(_i8(G[sel]).reshape(-1, G.shape[2]).T, _i8(a_in[sel]).reshape(-1, a_in.shape[2]))
            self.k.shift_add(np.ascontiguousarray(dW).reshape(G.shape[2], -1), kv, out[o:o + size])
        return True

    def weight_grad(self, eng, out, pi, G, a_in, e, frac_bits, limit):
        """fold_grad, else eng._weight_grad's literal route (the per-micro-batch GEMM, then
        _accumulate) where a micro-batch's rows fit one exact float32 GEMM; else
        eng._weight_grad."""
        if self.fold_grad(eng, out, pi, G, a_in, e, frac_bits, limit):
            return None
        if G.shape[1] > MAX_K_FLOAT32:
            return eng._weight_grad(out, pi, G, a_in, e, frac_bits, limit)
        dW = np.stack([_mm2(G[i].T, a_in[i]) for i in range(G.shape[0])])
        p = np.ldexp(1.0, np.asarray(e, np.int64) + frac_bits).reshape(-1)
        o = eng.layout.offsets[pi]
        self.k.accum(dW.reshape(dW.shape[0], -1), np.broadcast_to(p, (dW.shape[0],)).copy(), float(limit),
                     out[o:o + dW[0].size])

    def rq8(self, eng, V, e, am=None, dtype=np.int8):
        """(int8, e + s): int8 feeds the exact int8 GEMMs without a cast (``dtype`` float32:
        the per-head GEMMs' operand, the same integers). ``am``: max|V| per micro-batch
        where the caller has it."""
        V = np.ascontiguousarray(V)
        out = np.empty(V.shape, dtype)
        e_out = np.empty(V.shape[0], np.int64)
        V2 = V.reshape(V.shape[0], -1)
        am = np.full(V.shape[0], -1.0) if am is None else np.array(am, np.float64)  # -1: the loop takes it
        self.k.rq8(V2, am, _per_mb(e, V.shape[0]), out.reshape(V.shape[0], -1),
                   e_out)
        return out, e_out

    def rq8x(self, V, e, mask=None, sums=False):
        """rq8 of V * (mask > 0) (no mask: V) and, where ``sums``, the int8 out's sum over its
        rows per micro-batch (int64, as numpy's): (int8, e + s, sums or None)."""
        V = np.ascontiguousarray(V)
        n = V.shape[0]
        out = np.empty(V.shape, np.int8)
        e_out = np.empty(n, np.int64)
        S = np.empty((n, V.shape[-1]) if sums else (0, 1), np.int64)
        M = np.ascontiguousarray(mask).reshape(V.shape) if mask is not None else np.empty((0, 1, 1), np.int8)
        self.k.rq8x(V.reshape(n, -1, V.shape[-1]), M, np.full(n, -1.0), np.asarray(e, np.int64).reshape(-1),
                    out.reshape(n, -1, V.shape[-1]), e_out, S)
        return out, e_out, (S if sums else None)

    def scatter_add(self, dE, tokens, G):
        """The embedding's scatter-add of G's rows (n, R, D) into dE (n, V, D) int64."""
        self.k.scatter(np.ascontiguousarray(tokens, np.int64), np.ascontiguousarray(G).reshape(dE.shape[0], -1,
                       dE.shape[2]), dE)

    def heads(self, M, n, b, T, H, dh):
        """attention._heads(M) as float32 (the per-head GEMMs' operand: the same integers,
        cast once in the copy that reorders them, not at each of the GEMMs that read them)."""
        out = np.empty((n * b * H, T, dh), np.float32)
        self.k.heads(np.ascontiguousarray(M).reshape(n, b, T, H, dh), out.reshape(n, b, H, T, dh))
        return out

    def rq8_rows(self, M, n, b, T, H, dh, e, sums=False):
        """rq8x(attention._rows(M), e) without the row-order copy: M (n*b*H, T, dh)."""
        out = np.empty((n, b * T, H * dh), np.int8)
        e_out = np.empty(n, np.int64)
        S = np.empty((n, H * dh) if sums else (0, 1), np.int64)
        self.k.rq8_rows(np.ascontiguousarray(M).reshape(n, b, H, T, dh), np.asarray(e, np.int64).reshape(-1),
                        out, e_out, S)
        return out, e_out, (S if sums else None)

    def affine_align(self, eng, X, ex, a, ea, W2, bias, tracing):
        """The affine of a (its GEMM's int32 sums and the bias in accumulator units), then
        its align-add onto the stream X, the bias added inside the align-add (no float64
        sums written): (S, eS, Wq, ew, bacc, acc), S int32; acc (for the trace) only where
        ``tracing``, else None."""
        acc32, sexp, Wq, ew, bacc = self._gemm(eng, a, ea, W2, bias)
        S, eS = self._align2(X, ex, acc32, sexp, bacc)
        acc = acc32.astype(np.float64) + bacc[:, None, :] if tracing else None
        return S, eS, Wq, ew, bacc, acc

    def _align2(self, X, e0, A, e1, bacc=None):
        """align_add([(X, e0), (A (+ bacc per column), e1)]) by _nb_align2: int32 out."""
        X, A = np.asarray(X), np.asarray(A)
        n, C = X.shape[0], X.shape[-1]
        X3, A3 = X.reshape(n, -1, C), A.reshape(n, -1, C)
        out = np.empty(X3.shape, np.int32)
        e_out = np.empty(n, np.int64)
        b = np.empty((n, 0)) if bacc is None else np.ascontiguousarray(bacc, np.float64)
        self.k.align2(X3, A3, b, _per_mb(e0, n), _per_mb(e1, n), out, e_out)
        return out.reshape(X.shape), e_out

    def align_add(self, ops):
        if len(ops) == 2 and np.shape(ops[0][0]) == np.shape(ops[1][0]) and np.ndim(ops[0][0]) >= 2:
            return self._align2(ops[0][0], ops[0][1], ops[1][0], ops[1][1])
        first = np.asarray(ops[0][0])
        shape, n = first.shape, first.shape[0]
        dts = {np.asarray(V).dtype for V, _ in ops}
        dt = dts.pop() if len(dts) == 1 else np.float64
        # one array type for the tuple: C order, writable (a broadcast view is read-only)
        Vs = tuple(np.require(np.asarray(V, dt).reshape(n, -1), dt, ["C", "W"]) for V, _ in ops)
        es = np.stack([_per_mb(e, n) for _, e in ops])
        S = np.empty(Vs[0].shape, np.float64)
        e_out = np.empty(n, np.int64)
        self.k.align(Vs, es, S, e_out)
        return S.reshape(shape), e_out

    def rms_forward(self, x, am=None):
        """norm.rms_forward (y int32: |y| <= C + 1); ``am`` (n,) float64, where given, gets
        max|y| per micro-batch (the requantize after it then skips its own pass)."""
        x = np.ascontiguousarray(x)  # the wide stream: int32 (an align-add's) or float64 integers
        n, R, D = x.shape
        y = np.empty((n, R, D), np.int32)
        q = np.empty((n, R), np.int64)
        j = np.empty((n, R), np.int64)
        self.k.rms_fwd(x, self._norm_c(D), y, q, j, np.empty(n) if am is None else am)
        return y, (y, q, j)

    def rms_backward(self, g, eg, ex, cache):
        y, q, j = cache
        g = np.ascontiguousarray(g)  # int8 or float64 integers: read as int64
        dx = np.empty(g.shape, np.float64)
        J = self.k.rms_back(g, y, q, j, self._norm_c(g.shape[-1]), dx)
        e = np.asarray(eg, np.int64) - 3 * F - np.asarray(ex, np.int64) + J
        e_out = np.empty(g.shape[0], np.int64)
        flat = dx.reshape(g.shape[0], -1)
        self.k.norm15(flat, _per_mb(e, g.shape[0]), e_out)
        return dx, e_out

    def softmax_int(self, eng, Sc, E):
        Sc = np.ascontiguousarray(Sc)
        mult = np.ldexp(1.0, _per_mb(np.asarray(E, np.int64).reshape(-1), Sc.shape[0]) + 4)
        P = np.empty(Sc.shape, np.float32)
        if self._exp is None or self._exp[0] is not eng.exp_t:  # the table as int64, made once
            self._exp = (eng.exp_t, np.asarray(eng.exp_t).astype(np.int64))
        self.k.softmax(Sc, mult, self._exp[1], P)
        return P

    def output_error(self, z, x, y):
        """Engine.top_errors of a sequence model's cross-entropy (the targets seq_targets(x,
        y), the errors rounded stochastically with engine/sround.py's row keys, then made
        zero-sum per row) by engine/kernels.py's compiled loss (the dense and image paths'
        one: the same float64 operations in the same order) and one compiled pass for the
        keys, the rounding and the zero-sum: (G int8, eg, loss, correct), or None where a
        kernel's precondition fails (the numpy rules then run)."""
        from daisychain.engine import kernels as shared

        base = shared.compiled()
        if base is None:
            return None
        n, b, C = z.shape
        x = np.ascontiguousarray(x, np.int64)
        y = np.ascontiguousarray(y, np.int64)
        yt = np.empty((n, b), np.int64)
        yt.reshape(n, -1, x.shape[2])[...] = np.concatenate([x[..., 1:], y[..., None]], axis=-1)  # seq_targets
        z2 = np.ascontiguousarray(z, np.float64).reshape(n * b, C)
        dz = np.empty((n, b, C))
        py = np.empty((n, b))
        correct = np.empty(n, np.int64)
        if not base.output_error(z2, yt.reshape(-1), b, dz.reshape(n * b, C), py.reshape(-1), correct):
            return None
        loss = -np.log(np.maximum(py, 1e-300)).mean(axis=1)  # display only, as _output_error
        keys = np.empty((n, b), np.uint32)
        self.k.row_keys(x, y, keys)
        G = np.empty((n, b, C), np.int8)
        eg = np.empty(n, np.int64)
        self.k.seq_errors(dz, keys, yt, G, eg)
        return G, eg, loss, correct

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

"""The engine's fast path for dense models: the same bits as the literal path in
``daisychain.engine.model``, by exact arithmetic instead of table gathers, with few numpy
calls per step (on arrays this small, numpy's per-call overhead is most of the time).

Why each shortcut gives the same bits (all tables were checked equal to their
definitions by :func:`daisychain.units.gemm.tables_are_exact`):

* ``requantize(acc, s) == clamp(floor(acc * 2**-s + 1/2), -127, 127)`` (docs/UNITS.md), and
  a ReLU after it is the same expression with lower bound 0.
* Integer-valued arrays are float32 where every value is an integer of magnitude below
  2**24 (float32 holds those exactly):

  - a GEMM on operands in [-127, 127] with inner size K <= 1024: every product and partial
    sum is an integer below K * 127**2 < 2**24, exact in any order;
  - the bias add rounds the exact sum once to float32 (a float32 add when the bias
    values are themselves exact in float32, else a float64 add then a cast); a rounding
    would need a sum >= 2**24 in magnitude, and float rounding is monotone with 2**24 a float32, so a
    computed max |acc| below 2**24 proves that every sum was exact (otherwise the layer
    is redone in float64);
  - the rounding shift: ``acc * 2**-s`` is exact; with ``s = bitlen(max|acc|) - 7 <= 17``
    the value ``acc * 2**-s + 1/2`` is a multiple of ``2**-s`` and either below 128 in
    magnitude (under 2**24 units: exact) or >= 128, where the clamp gives 127 whatever
    the rounding;
  - the folded weight gradient (see ``_weight_grad``) runs as float32 GEMMs over groups of
    rows whose partial sums stay below 2**24.

Anything outside those bounds (K > 1024, huge biases) runs the same formulas in float64,
where all values are integers below 2**53.

Those numpy passes are the definition of this path. Once numba is loaded (see
COMPILED_AFTER_S) the same values come from compiled kernels (the end of this module): the
GEMMs stay the float32 BLAS calls above, over all micro-batches' rows at once, and each pass
between them is one loop, in integers where the values are integers (accumulator + bias,
rounding shift, ReLU mask, column sums) and otherwise the same IEEE float64 operations in
the same order (quantization, bias scaling, softmax with dexp, fixed-point scaling).
The folded weight gradient there bounds every partial sum per element instead of by the
worst case, so float32 takes almost every step. A kernel whose preconditions fail
(non-finite values, exponents beyond +-900, K > 1024) hands the call to the numpy passes.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time

import numpy as np

from daisychain.compiled import numba_jit
from daisychain.engine.detmath import dexp, zero_sum_errors
from daisychain.engine.layers import kind_of

BIAS_LIMIT = 2.0**30
F32_EXACT = 2.0**24
MAX_K_F32 = 2**24 // (128 * 128)  #: inner size for which a float32 GEMM of unit operands is exact
_DOT = 127 * 127  #: largest |product| of two operands in [-127, 127]
_ONE32 = np.float32(1.0)
#: The compiled kernels (see the end of this module) are taken once numba is imported, or
#: once this process has spent COMPILED_AFTER_S seconds in the numpy passes: importing
#: numba and loading the first compiled function cost ~0.75 s of CPU once per process,
#: so a short run (tests, a default ``daisychain train``) never pays it, and a long one
#: spends at most that much before switching. Both paths give the same bits.
COMPILED_AFTER_S = 0.75
_numpy_seconds = [0.0]  #: time this process spent in the numpy passes, before the switch


def _qexp(m: np.ndarray) -> np.ndarray:
    """quant_exponent per element of m (float64 >= 0): exponent(m) - 7, 0 where m == 0."""
    e = np.frexp(m)[1].astype(np.int64)
    e -= 7
    e[m == 0] = 0
    return e


def _absmax(x2: np.ndarray) -> np.ndarray:
    """max |x| per row of a 2-D array (exact), float64."""
    return np.maximum(x2.max(axis=1), -x2.min(axis=1), dtype=np.float64)


def _shift(am: np.ndarray) -> np.ndarray:
    """max(0, exponent(am) - 7) per element."""
    s = np.frexp(am)[1].astype(np.int64)
    s -= 7
    return np.maximum(s, 0, out=s)


def _quantize(v: np.ndarray, scale, m, out: np.ndarray, tmp: np.ndarray | None = None) -> np.ndarray:
    """out = clamp(floor(v * scale + 1/2), -127, 127), in float64 as detmath.quantize
    (scale = 2**-e, per row or one number), written to ``out`` (float32: small integers).

    ``m`` is max |v| (per row, or one number). The clamp can only act when
    floor(m * scale + 1/2) > 127: the same float64 operations are monotone, and when
    m * scale + 1/2 rounds below 128 then -m * scale + 1/2 > -127. Then it is skipped."""
    t = np.multiply(v, scale, out=tmp)
    t += 0.5
    top = float((m * scale.ravel()).max()) if isinstance(scale, np.ndarray) else m * scale
    if math.floor(top + 0.5) <= 127:  # the same float64 product and sum as for the elements
        return np.floor(t, out=out)
    np.floor(t, out=t)
    np.minimum(t, 127.0, out=t)
    return np.maximum(t, -127.0, out=out)


def _round_shift(acc: np.ndarray, s: np.ndarray, am: np.ndarray, lo: float) -> np.ndarray:
    """In place: acc (n, rows, cols) -> clamp(floor(acc * 2**-s + 1/2), lo, 127).

    ``am`` = max |acc| per micro-batch. acc * 2**-s + 1/2 is exact here (float32 below
    2**24 as shown above, float64 always), so the upper clamp (and a lower one at -127)
    can only act when am * 2**-s + 1/2 >= 128 (exact in float64); otherwise it is
    skipped. A lower bound of 0 (ReLU) always applies."""
    p = np.ldexp(1.0, -s)
    np.multiply(acc, p.astype(acc.dtype)[:, None, None], out=acc)
    acc += 0.5
    np.floor(acc, out=acc)
    clamp = bool(((am * p + 0.5) >= 128.0).any())
    if clamp:
        np.minimum(acc, 127.0, out=acc)
    if lo == 0.0 or clamp:
        np.maximum(acc, lo, out=acc)
    return acc


def _gemm(a: np.ndarray, b: np.ndarray, k: int, out: np.ndarray | None = None) -> np.ndarray:
    """Exact product of integer matrices with entries in [-127, 127], inner size k
    (``out``: a float32 array to write to, used when the float32 product is exact)."""
    if k <= MAX_K_F32:
        return np.matmul(a, b, out=out)
    return a.astype(np.float64) @ b.astype(np.float64)


class _Buffers(threading.local):
    """Work arrays reused between calls (per thread: a peer may compute in a worker thread
    while another thread measures). Large fresh arrays cost page faults on every call."""

    def __init__(self):
        self.arrays: dict = {}

    def get(self, key, shape, dtype=np.float32) -> np.ndarray:
        arr = self.arrays.get(key)
        if arr is None or arr.shape != shape or arr.dtype != dtype:
            if len(self.arrays) > 256:
                self.arrays.clear()
            arr = self.arrays[key] = np.empty(shape, dtype)
        return arr


class FastPath:
    def __init__(self, spec, layout):
        self.spec = spec
        self.layout = layout
        self.plan = []  # per linear: (param index, n_in, n_out, ReLU follows, offset of W, of bias)
        pi = 0
        layers = spec.layers
        for li, layer in enumerate(layers):
            if kind_of(layer).params != 2:  # a linear (the engine takes this path for dense_fast kinds only)
                continue
            relu = li + 1 < len(layers) and kind_of(layers[li + 1]).type == "relu"
            self.plan.append((pi, layer.n_in, layer.n_out, relu,
                              layout.offsets[pi], layout.offsets[pi + 1]))
            pi += 2
        self._sel: dict = {}
        self._buf = _Buffers()
        # the compiled path holds every GEMM in float32: inner sizes up to MAX_K_F32
        self._nb_fits = all(k_in <= MAX_K_F32 and k_out <= MAX_K_F32 for _, k_in, k_out, *_ in self.plan)

    def _kernels(self):
        if not self._nb_fits:
            return None
        if _compiled is None and _numpy_seconds[0] < COMPILED_AFTER_S and "numba" not in sys.modules:
            return None
        return _kernels()

    # ------------------------------------------------------------------ compiled path
    def _forward_nb(self, kern, theta, x, fresh: bool):
        """The forward pass through the compiled kernels: logits (n, b, classes) float64 and
        the cache, or None where a kernel's preconditions fail (the caller then takes the
        numpy passes). ``fresh``: the logits in a new array (else a reused work array)."""
        n, b = x.shape[0], x.shape[1]
        if (not self._nb_fits or n * b == 0 or theta.dtype != np.float64 or theta.ndim != 1
                or not theta.flags.c_contiguous):
            return None
        x2 = np.ascontiguousarray(x.reshape(n, -1), dtype=np.float64)
        buf = self._buf.get
        ex = buf(("ex", -1), (n,), np.int64)
        a = buf("x", x2.shape)
        if not kern.quant_rows(x2, a, ex):
            return None
        a = a.reshape(n * b, -1)
        cache = []
        last = len(self.plan) - 1
        ewv = buf("ew", (1,), np.int64)
        for li, (pi, k_in, k_out, relu, ow, ob) in enumerate(self.plan):
            Wq = buf(("Wq", li), (k_out, k_in))
            if not kern.quant_rows(theta[ow:ow + k_in * k_out].reshape(1, -1), Wq.reshape(1, -1), ewv):
                return None
            ew = int(ewv[0])
            cache.append((a, ex, Wq, ew))
            acc = np.matmul(a, Wq.T, out=buf(("acc", li), (n * b, k_out)))  # exact: K <= MAX_K_F32
            bias = theta[ob:ob + k_out]
            scratch = buf(("bacc", li), (k_out,), np.int64)
            if li == last:
                z = np.empty((n * b, k_out)) if fresh else buf("z", (n * b, k_out), np.float64)
                if not kern.logits(acc, bias, ex, ew, b, z, scratch):
                    return None
                return z.reshape(n, b, k_out), cache
            ex_next = buf(("ex", li), (n,), np.int64)
            if not kern.hidden(acc, bias, ex, ew, b, 0 if relu else -127, ex_next, scratch):
                return None
            a, ex = acc, ex_next
        raise AssertionError("spec validation guarantees a final linear layer")

    def _grad_nb(self, kern, theta, x, y, frac_bits, limit):
        n, b = y.shape
        got = self._forward_nb(kern, theta, x, fresh=False)
        if got is None:
            return None
        z, cache = got
        C = z.shape[2]
        buf = self._buf.get
        z2 = z.reshape(n * b, C)
        yv = np.ascontiguousarray(y.reshape(-1), dtype=np.int64)
        dz = buf("dz", (n, b * C), np.float64)
        py = np.empty((n, b))
        correct = np.empty(n, np.int64)
        if not kern.output_error(z2, yv, b, dz.reshape(n * b, C), py.reshape(-1), correct):
            return None
        eg = buf(("eg", -1), (n,), np.int64)
        G = buf("G", (n, b * C))
        if not kern.quant_rows(dz, G, eg):
            return None
        t = np.maximum(py, 1e-300, out=py)  # the display loss, as in output_error
        np.log(t, out=t)
        loss = -(np.add.reduce(t, axis=1) / b)
        G = zero_sum_errors(G.reshape(n * b, C), yv)
        out = np.empty(self.layout.size, np.int64)
        for k in range(len(self.plan) - 1, -1, -1):
            pi, k_in, k_out, _, ow, ob = self.plan[k]
            a_in, ex, Wq, ew = cache[k]
            dst = out[ob:ob + k_out]
            if not kern.bias_grad(G, b, eg, frac_bits, limit, dst, buf(("col", k), (k_out,), np.int64)):
                dst[:] = _fixed_sum(G.reshape(n, b, k_out).sum(axis=1, dtype=np.float64), eg, frac_bits, limit)
            self._weight_grad_nb(kern, out[ow:ow + k_in * k_out], G, a_in, n, b, eg, ex, frac_bits, limit, k)
            if k == 0:
                break
            dX = np.matmul(G, Wq, out=buf(("dX", k), (n * b, k_in)))  # exact: K = k_out <= MAX_K_F32
            eg_next = buf(("eg", k), (n,), np.int64)
            kern.backward_hidden(dX, a_in, self.plan[k - 1][3], b, eg, ew, eg_next)
            G, eg = dX, eg_next
        return out, loss, correct

    def _weight_grad_nb(self, kern, dst, G, a_in, n, b, eg, ex, frac_bits, limit, k):
        """dst = the weight gradient's fixed-point sum over micro-batches (see _weight_grad):
        the compiled kernel scales the narrower operand's rows by 2**(k_j - kmin) and bounds
        every partial sum of the folded GEMM; float32 when that bound is below 2**24,
        float64 below 2**53; anything else takes _weight_grad."""
        scale_a = a_in.shape[1] <= G.shape[1]
        sc = self._buf.get(("wsc", k), a_in.shape if scale_a else G.shape)
        bound, kmin = kern.wgrad_prep(G, a_in, eg, ex, frac_bits, limit, b, scale_a, sc)
        if bound < 0.0 or bound >= 2.0**53:
            self._weight_grad(dst, G, a_in, n, eg + ex, frac_bits, limit,
                              self._buf.get(("dW", k), (G.shape[1], a_in.shape[1])))
            return
        Gp, ap = (G, sc) if scale_a else (sc, a_in)
        if bound < F32_EXACT:
            t = np.matmul(Gp.T, ap, out=self._buf.get(("dW", k), (G.shape[1], a_in.shape[1])))
        else:  # every partial sum an integer below 2**53: exact in float64
            t = np.matmul(Gp.T.astype(np.float64), ap.astype(np.float64))
        kern.wgrad_store(t, kmin, dst)

    # ------------------------------------------------------------------ forward
    def forward(self, theta: np.ndarray, x: np.ndarray):
        """Logits (n, b, classes) float64 and the cache for the backward pass."""
        kern = self._kernels()
        if kern is not None:
            got = self._forward_nb(kern, theta, x, fresh=True)
            if got is not None:
                return got
            return self._forward_np(theta, x)
        t = time.perf_counter()
        got = self._forward_np(theta, x)
        _numpy_seconds[0] += time.perf_counter() - t
        return got

    def _forward_np(self, theta: np.ndarray, x: np.ndarray):
        """The forward pass in numpy passes (the definition the compiled one is tested against)."""
        n, b = x.shape[0], x.shape[1]
        x2 = x.reshape(n, -1)
        buf = self._buf.get
        mx = _absmax(x2)
        ex = _qexp(mx)  # (n,)
        a = _quantize(x2, np.ldexp(1.0, -ex)[:, None], mx, buf("x", x2.shape))
        a = a.reshape(n * b, -1)
        cache = []  # per linear: (a_in, ex, Wq, ew)
        last = len(self.plan) - 1
        for li, (pi, k_in, k_out, relu, ow, ob) in enumerate(self.plan):
            W = theta[ow:ow + k_in * k_out].reshape(k_out, k_in)
            bias = theta[ob:ob + k_out]
            mw = max(float(W.max()), -float(W.min()))
            ew = math.frexp(mw)[1] - 7 if mw > 0 else 0
            Wq = _quantize(W, math.ldexp(1.0, -ew), mw, buf(("Wq", li), W.shape),
                           buf(("W64", li), W.shape, np.float64))
            cache.append((a, ex, Wq, ew))
            sexp = ex + ew
            bacc = np.multiply(bias, np.ldexp(1.0, -sexp)[:, None])  # (n, out)
            bacc += 0.5
            np.floor(bacc, out=bacc)
            np.minimum(bacc, BIAS_LIMIT, out=bacc)
            np.maximum(bacc, -BIAS_LIMIT, out=bacc)
            acc = _gemm(a, Wq.T, k_in, buf(("acc", li), (n * b, k_out))).reshape(n, b, k_out)
            if acc.dtype == np.float32 and float(np.abs(bacc).max()) <= F32_EXACT:
                bacc = bacc.astype(np.float32)  # exact: integers up to 2**24
            np.add(acc, bacc[:, None, :], out=acc)  # one rounding of the exact sum (see above)
            am = _absmax(acc.reshape(n, -1))
            if acc.dtype != np.float64 and float(am.max()) >= F32_EXACT:
                acc = _gemm(a.astype(np.float64), Wq.T.astype(np.float64), k_in).reshape(n, b, k_out)
                acc += bacc[:, None, :]
                am = _absmax(acc.reshape(n, -1))
            if li == last:
                z = acc.astype(np.float64)
                z *= np.ldexp(1.0, sexp)[:, None, None]
                return z, cache
            s = _shift(am)
            a = _round_shift(acc, s, am, 0.0 if relu else -127.0)
            a = a.astype(np.float32, copy=False).reshape(n * b, k_out)
            ex = sexp + s
        raise AssertionError("spec validation guarantees a final linear layer")

    # ------------------------------------------------------------------ loss
    def _select(self, n: int, b: int):
        key = (n, b)
        if key not in self._sel:
            self._sel = {key: (np.arange(n)[:, None], np.arange(b)[None, :])}
        return self._sel[key]

    def output_error(self, z: np.ndarray, y: np.ndarray):
        """dz = (softmax(z) - onehot(y)) / b in place of a fresh array, the display loss
        (mean -log p_y per micro-batch) and the number correct per micro-batch."""
        n, b = y.shape
        e = dexp(z - z.max(axis=-1, keepdims=True))
        # total = 0; total = total + e_c in class order: accumulate adds strictly in
        # sequence, and 0 + e_0 == e_0 exactly
        p = np.divide(e, np.add.accumulate(e, axis=-1)[..., -1:], out=e)
        rows, cols = self._select(n, b)
        py = p[rows, cols, y]
        t = np.maximum(py, 1e-300)
        np.log(t, out=t)
        loss = -(np.add.reduce(t, axis=1) / b)  # == -log(...).mean(axis=1), bit for bit
        correct = (z.argmax(axis=-1) == y).sum(axis=1)
        py -= 1.0
        p[rows, cols, y] = py  # p - onehot (p - 0 == p elsewhere)
        p /= float(b)
        return p, loss, correct

    # ------------------------------------------------------------------ backward
    def grad(self, theta, x, y, frac_bits: int, limit: float):
        """(int64 fixed-point gradient sum, loss per micro-batch, correct per micro-batch)."""
        kern = self._kernels() if self.spec.loss == "cross_entropy" else None
        if kern is not None:
            got = self._grad_nb(kern, theta, x, y, frac_bits, limit)
            if got is not None:
                return got
            return self._grad_np(theta, x, y, frac_bits, limit)
        t = time.perf_counter()
        got = self._grad_np(theta, x, y, frac_bits, limit)
        _numpy_seconds[0] += time.perf_counter() - t
        return got

    def _grad_np(self, theta, x, y, frac_bits: int, limit: float):
        """The gradient in numpy passes (the definition the compiled one is tested against;
        the only pass of an "mse" model: the compiled kernels are cross-entropy's)."""
        n, b = y.shape[:2]
        z, cache = self._forward_np(theta, x)
        if self.spec.loss == "mse":
            from daisychain.engine.model import mse_output_error
            dz, loss, correct = mse_output_error(z, y)
        else:
            dz, loss, correct = self.output_error(z, y)
        dz2 = dz.reshape(n, -1)
        mz = _absmax(dz2)
        eg = _qexp(mz)
        buf = self._buf.get
        G = _quantize(dz2, np.ldexp(1.0, -eg)[:, None], mz, buf("G", dz2.shape))
        G = G.reshape(n * b, -1)
        if self.spec.loss == "cross_entropy":
            G = zero_sum_errors(G, y)
        out = np.empty(self.layout.size, np.int64)
        for k in range(len(self.plan) - 1, -1, -1):
            pi, k_in, k_out, _, ow, ob = self.plan[k]
            a_in, ex, Wq, ew = cache[k]
            self._weight_grad(out[ow:ow + k_in * k_out], G, a_in, n, eg + ex, frac_bits, limit,
                              buf(("dW", k), (k_out, k_in)))
            db = G.reshape(n, b, k_out).sum(axis=1, dtype=np.float64)  # exact integers
            out[ob:ob + k_out] = _fixed_sum(db, eg, frac_bits, limit)
            if k == 0:
                break
            dX = _gemm(G, Wq, k_out, buf(("dX", k), (n * b, k_in))).reshape(n, b, k_in)  # exponent eg + ew
            if self.plan[k - 1][3]:  # zero where the previous layer's ReLU output was 0
                np.multiply(dX, a_in.reshape(n, b, k_in) > 0, out=dX)
            am = _absmax(dX.reshape(n, -1))
            s = _shift(am)
            G = _round_shift(dX, s, am, -127.0).astype(np.float32, copy=False).reshape(n * b, k_in)
            eg = eg + ew + s
        return out, loss, correct

    @staticmethod
    def _weight_grad(dst, G, a_in, n, e, frac_bits, limit, tbuf):
        """dst (the tensor's slice of the int64 sum) = sum over micro-batches of the
        fixed-point dW = G^T a (exponent e per micro-batch).

        When every micro-batch's scale 2**(e + S) is an integer and no element can reach
        the clamp, each fixed-point value is the exact integer G^T a * 2**(e + S), so the
        sum over micro-batches is one GEMM over all (micro-batch, sample) rows with each
        micro-batch's rows scaled by 2**(k - kmin): integers below 2**51, exact in float64
        in any order (one float64 GEMM when the worst-case sum of all |terms| stays below
        2**53), and in float32 over any group of rows whose worst-case sum stays below
        2**24."""
        b = G.shape[0] // n
        k = e + frac_bits
        kmin, kmax = int(k.min()), int(k.max())
        if kmin < 0 or float(b * _DOT) * math.ldexp(1.0, kmax) > limit:
            G3 = G.reshape(n, b, -1).astype(np.float64)
            dW = np.matmul(G3.transpose(0, 2, 1), a_in.reshape(n, b, -1).astype(np.float64))
            dst[:] = _fixed_sum(dW, e, frac_bits, limit).ravel()
            return
        # every partial sum is bounded by the sum of all |terms| <= b * 127**2 * sum(2**(k - kmin))
        spread_sum = b * _DOT * int(np.ldexp(1.0, k - kmin).sum())
        if spread_sum < 2**24:  # one float32 GEMM over every row
            chunks = [(None, kmin)]
        elif spread_sum < 2**53:  # one float64 GEMM over every row: every partial sum exact
            sc = np.ldexp(1.0, k - kmin)[:, None, None]
            G64, a64 = G.reshape(n, b, -1).astype(np.float64), a_in.reshape(n, b, -1).astype(np.float64)
            if a_in.shape[1] <= G.shape[1]:
                a64 *= sc
            else:
                G64 *= sc
            t = np.matmul(G64.reshape(n * b, -1).T, a64.reshape(n * b, -1))
            np.multiply(t, math.ldexp(1.0, kmin), out=dst.reshape(t.shape), casting="unsafe")
            return
        else:  # micro-batches of equal k, as many per GEMM as keep it exact
            per = max(1, (2**24 - 1) // (b * _DOT))
            chunks = []
            for kv in np.unique(k):
                mbs = np.flatnonzero(k == kv)
                chunks += [(mbs[i:i + per], int(kv)) for i in range(0, len(mbs), per)]
        scale_a = a_in.shape[1] <= G.shape[1]  # scale the narrower operand's rows
        total = None
        for mbs, kg in chunks:
            if mbs is None:
                m, Gp, ap, kp = n, G, a_in, k - kg
            else:
                m, kp = len(mbs), k[mbs] - kg
                Gp = G.reshape(n, b, -1)[mbs].reshape(m * b, -1)
                ap = a_in.reshape(n, b, -1)[mbs].reshape(m * b, -1)
            spread = int(kp.max())
            if spread:
                sc = np.ldexp(_ONE32, kp)[:, None, None]
                if scale_a:
                    ap = (ap.reshape(m, b, -1) * sc).reshape(m * b, -1)
                else:
                    Gp = (Gp.reshape(m, b, -1) * sc).reshape(m * b, -1)
            if b * _DOT * int(np.ldexp(1.0, kp).sum()) < 2**24:
                t = np.matmul(Gp.T, ap, out=tbuf if mbs is None else None)
            else:  # one micro-batch of more than 1040 samples: float64 is exact
                t = Gp.T.astype(np.float64) @ ap.astype(np.float64)
            if mbs is None and t.dtype == np.float32:
                # the exact power-of-two scaling and the integer cast in one pass
                np.multiply(t, np.float32(math.ldexp(1.0, kmin)), out=dst.reshape(t.shape),
                            casting="unsafe")
                return
            t = t.astype(np.float64)
            t *= math.ldexp(1.0, kg)
            total = t if total is None else np.add(total, t, out=total)
        dst[:] = total.ravel()


def _fixed_sum(ints: np.ndarray, e: np.ndarray, frac_bits: int, limit: float) -> np.ndarray:
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
# kernel computes the same values as the numpy passes above (tests/test_engine_fast.py
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


def _nb_dexp(x):
    """detmath.dexp for one finite x <= 0, the same operations in the same order."""
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
    return math.ldexp(p, np.int64(k))


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
        total = 0.0
        for c in range(C):
            e = _nb_dexp(z[r, c] - m)
            dz[r, c] = e
            total = total + e
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


def _kernels():
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
    return _kernels() is not None


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

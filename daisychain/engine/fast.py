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
COMPILED_AFTER_S) the same values come from compiled kernels (``daisychain.engine.kernels``): the
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
import sys
import threading
import time

import numpy as np

from daisychain.engine.detmath import dexp, mse_output_error, zero_sum_errors
from daisychain.engine import kernels
from daisychain.engine.kernels import BIAS_LIMIT, fixed_sum as _fixed_sum
from daisychain.engine.layers import kind_of

F32_EXACT = 2.0**24
MAX_K_F32 = 2**24 // (128 * 128)  #: inner size for which a float32 GEMM of unit operands is exact
_DOT = 127 * 127  #: largest |product| of two operands in [-127, 127]
_ONE32 = np.float32(1.0)
#: The compiled kernels (see the end of this module) are taken once numba is imported, or
#: once this process has spent COMPILED_AFTER_S seconds of CPU (its threads' time, which a
#: loaded machine does not inflate as it does wall-clock time) in the numpy passes: importing
#: numba and loading the first compiled function cost ~0.75 s of CPU once per process,
#: so a short run (tests, a default ``daisychain train``) never pays it, and a long one
#: spends at most that much before switching. Both paths give the same bits.
COMPILED_AFTER_S = 0.75
_numpy_seconds = [0.0]  #: CPU time this process spent in the numpy passes, before the switch


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
            low = kind_of(layer).lower(layer, li, layers)  # ("linear", facts); None: a folded relu
            if low is None:
                continue
            f = low[1]
            self.plan.append((pi, f["n_in"], f["n_out"], f["relu"], layout.offsets[pi], layout.offsets[pi + 1]))
            pi += 2
        self._sel: dict = {}
        self._buf = _Buffers()
        # the compiled path holds every GEMM in float32: inner sizes up to MAX_K_F32
        self._nb_fits = all(k_in <= MAX_K_F32 and k_out <= MAX_K_F32 for _, k_in, k_out, *_ in self.plan)

    def _kernels(self):
        if not self._nb_fits:
            return None
        if kernels.compiled_state() is None and _numpy_seconds[0] < COMPILED_AFTER_S and "numba" not in sys.modules:
            return None
        return kernels.compiled()

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
        t = time.thread_time()
        got = self._forward_np(theta, x)
        _numpy_seconds[0] += time.thread_time() - t
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
        t = time.thread_time()
        got = self._grad_np(theta, x, y, frac_bits, limit)
        _numpy_seconds[0] += time.thread_time() - t
        return got

    def _grad_np(self, theta, x, y, frac_bits: int, limit: float):
        """The gradient in numpy passes (the definition the compiled one is tested against;
        the only pass of an "mse" model: the compiled kernels are cross-entropy's)."""
        n, b = y.shape[:2]
        z, cache = self._forward_np(theta, x)
        if self.spec.loss == "mse":
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

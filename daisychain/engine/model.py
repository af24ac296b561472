"""Forward and backward through the units, for a set of micro-batches at once.

Everything a micro-batch produces is an exact function of (parameters, its samples): every
scale is taken per micro-batch (or per parameter tensor), never across micro-batches, and
the micro-batches of one call share nothing but the parameters. So any split of a step's
micro-batches over peers gives the same per-micro-batch integers.

Shapes: n = micro-batches in the call, b = samples per micro-batch. Integer-valued arrays
are held in floats (exact, see ``daisychain.units.gemm``) so the GEMMs run on BLAS.
The exact sequence of operations is written down in docs/ENGINE.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daisychain.engine.fast import FastPath
from daisychain.engine.detmath import dexp, exponent, pow2, quant_exponent, quantize
from daisychain.engine.spec import ModelSpec
from daisychain.units import reference as ref
from daisychain.units.gemm import MAX_K_FLOAT32, gemm_lut, require_exact_mul, tables_are_exact
from daisychain.units.luts import LutSet

BIAS_LIMIT = 2.0**30  #: biases in accumulator units are clamped to ±2**30


class ParamLayout:
    """Where each tensor lives in the flat float64 parameter vector (canonical order)."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.names, self.shapes, self.offsets = [], [], []
        off = 0
        for name, shape in spec.param_shapes():
            self.names.append(name)
            self.shapes.append(shape)
            self.offsets.append(off)
            off += int(np.prod(shape))
        self.size = off

        self._slices = [(o, o + int(np.prod(s)), s) for o, s in zip(self.offsets, self.shapes)]

    def views(self, theta: np.ndarray) -> list[np.ndarray]:
        return [theta[a:b].reshape(s) for a, b, s in self._slices]


def init_params(spec: ModelSpec, seed: int) -> np.ndarray:
    """Uniform(-bound, bound) from the integer PRNG: bound = 1/sqrt(fan_in) for a linear's
    weight and bias (torch's default), 1 for an embedding. Stream = canonical tensor index."""
    from daisychain.engine import prng

    layout = ParamLayout(spec)
    theta = np.empty(layout.size, np.float64)
    idx = 0
    for layer in spec.layers:
        if layer.type == "relu":
            continue
        count = 2 if layer.type == "linear" else 1
        bound = 1.0 / np.sqrt(float(layer.n_in)) if layer.type == "linear" else 1.0
        for _ in range(count):
            o, s = layout.offsets[idx], layout.shapes[idx]
            f = prng.uniform(seed, prng.STREAM_PARAM + idx, int(np.prod(s)))
            theta[o:o + f.size] = (2.0 * f - 1.0) * bound
            idx += 1
    return theta


def _per_mb(e: np.ndarray, ndim: int) -> np.ndarray:
    """Reshape a per-micro-batch vector (n,) to broadcast against an (n, ...) array."""
    return np.asarray(e).reshape((-1,) + (1,) * (ndim - 1))


def _absmax(x: np.ndarray) -> np.ndarray:
    """max |x| per micro-batch (max is exact and order-free)."""
    return np.abs(x).reshape(x.shape[0], -1).max(axis=1)


@dataclass
class Result:
    """What a set of micro-batches contributes: the fixed-point sum and per-micro-batch facts."""

    grad: np.ndarray  #: int64 (P,): sum over the micro-batches of floor(g * 2**S + 1/2)
    loss: np.ndarray  #: float64 (n,): mean cross-entropy per micro-batch (display only)
    correct: np.ndarray  #: int64 (n,)


class Engine:
    """The numpy INT8 engine for one model spec. ``gemm="fast"`` (exact BLAS) or ``"lut"``
    (every product read from the table); both give the same bits."""

    def __init__(self, spec: ModelSpec, luts: LutSet, gemm: str = "fast"):
        self.spec = spec
        self.layout = ParamLayout(spec)
        self.luts = luts
        self.rq = luts.requantize.astype(np.float64)  # the unit tables, as floats for gathers
        self.relu_t = luts.relu.astype(np.float64)
        if gemm not in ("fast", "lut"):
            raise ValueError("gemm must be 'fast' or 'lut'")
        if gemm == "fast":
            require_exact_mul(luts)
        self.gemm = gemm
        # The fast path (see _grad_fast) computes requantize and ReLU by arithmetic, which
        # is valid only when their tables are exactly their definitions.
        fast = gemm == "fast" and spec.input_kind == "dense" and tables_are_exact(luts)
        self.fast = FastPath(spec, self.layout) if fast else None

    # ----------------------------------------------------------------- unit ops
    def _mm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Batched unit GEMM: (n, M, K) x (K, N) or (n, K, N) -> (n, M, N) exact integers."""
        if self.gemm == "lut":
            bb = np.broadcast_to(b, (a.shape[0],) + b.shape[-2:])
            return np.stack([gemm_lut(a[i].astype(np.int64), bb[i].astype(np.int64), self.luts)
                             for i in range(a.shape[0])]).astype(np.float64)
        dt = np.float32 if a.shape[-1] <= MAX_K_FLOAT32 else np.float64
        a, b = a.astype(dt, copy=False), b.astype(dt, copy=False)
        if b.ndim == 2:  # one shared right operand: a single GEMM over all micro-batch rows
            return (a.reshape(-1, a.shape[-1]) @ b).reshape(a.shape[:-1] + b.shape[1:]).astype(np.float64)
        return np.matmul(a, b).astype(np.float64)

    def _requantize(self, acc: np.ndarray, s: np.ndarray) -> np.ndarray:
        """The requantize unit with a shift per micro-batch. The routing of
        :func:`daisychain.units.reference.rq_route` done on integer-valued floats (exact:
        scaling by a power of two, floor and clamp never round), then the table."""
        s = _per_mb(s, acc.ndim)
        up = pow2(ref.RQ_TABLE_SHIFT - s)  # 2**(7 - s)
        x = np.floor(acc * up)  # s >= 7: acc >> (s - 7);  s < 7: acc << (7 - s)
        hi = np.where(s >= ref.RQ_TABLE_SHIFT, 32767.0, 32768.0 - up)  # (2**(8+s) - 1) << (7-s)
        x = np.minimum(np.maximum(x, -32768.0), hi)
        return self.rq[(x + 32768.0).astype(np.intp)]

    def _relu(self, q: np.ndarray) -> np.ndarray:
        return self.relu_t[(q + 128.0).astype(np.intp)]

    # ----------------------------------------------------------------- forward
    def forward(self, theta: np.ndarray, x: np.ndarray, trace: list | None = None):
        """x: (n, b, F) float features or (n, b, C) int token ids. Returns the logits
        (n, b, classes) float64 and the cache the backward pass needs. ``trace``, if given,
        collects (name, value) pairs of every intermediate (for golden vectors)."""
        if self.fast is not None and trace is None:
            return self.fast.forward(theta, x)
        return self._forward_reference(theta, x, trace)

    def _forward_reference(self, theta, x, trace=None):
        """The literal forward pass: every requantize and ReLU read from its table."""
        tr = trace.append if trace is not None else (lambda item: None)
        params = self.layout.views(theta)
        spec = self.spec
        n = x.shape[0]
        cache = []  # per linear: (param index, a_in, ex, Wq, ew, relu_out or None)
        pi = 0
        emb = None
        if spec.input_kind == "dense":
            ex = quant_exponent(_absmax(x))  # (n,)
            a = quantize(x, _per_mb(ex, x.ndim))
            tr(("input_exponent", ex))
            tr(("input_q", a))
        layers = spec.layers
        for li, layer in enumerate(layers):
            if layer.type == "embedding":
                E = params[pi]
                ee = int(quant_exponent(np.abs(E).max()))
                Eq = quantize(E, ee)
                a = Eq[x].reshape(n, x.shape[1], -1)  # (n, b, C*D)
                ex = np.full(n, ee, np.int64)
                tr((f"layers.{li}.weight_exponent", ee))
                tr((f"layers.{li}.out_q", a))
                emb = (pi, x)
                pi += 1
            elif layer.type == "linear":
                W, bias = params[pi], params[pi + 1]
                ew = int(quant_exponent(np.abs(W).max()))
                Wq = quantize(W, ew)
                acc = self._mm(a, Wq.T)  # (n, b, out)
                sexp = ex + ew  # (n,) exponent of the accumulator
                bacc = np.clip(np.floor(bias[None, :] * pow2(-sexp)[:, None] + 0.5),
                               -BIAS_LIMIT, BIAS_LIMIT)
                acc = acc + bacc[:, None, :]
                tr((f"layers.{li}.weight_exponent", ew))
                tr((f"layers.{li}.bias_acc", bacc))
                tr((f"layers.{li}.acc", acc))
                entry = [pi, a, ex, Wq, ew, None]
                cache.append(entry)
                pi += 2
                if li == len(layers) - 1:
                    tr(("logits", acc * _per_mb(pow2(sexp), 3)))
                    return acc * _per_mb(pow2(sexp), 3), (cache, emb)
                s = np.maximum(exponent(_absmax(acc)) - 7, 0)  # bit length - 7
                a = self._requantize(acc, s)
                ex = sexp + s
                tr((f"layers.{li}.shift", s))
                tr((f"layers.{li}.out_q", a))
            elif layer.type == "relu":
                a = self._relu(a)
                cache[-1][5] = a
                tr((f"layers.{li}.out_q", a))
        raise AssertionError("spec validation guarantees a final linear layer")

    # ----------------------------------------------------------------- loss
    @staticmethod
    def softmax(z: np.ndarray) -> np.ndarray:
        """Row softmax with the deterministic exp and a sequential sum over classes."""
        e = dexp(z - z.max(axis=-1, keepdims=True))
        # total = 0; total = total + e_c for c in order: accumulate adds strictly in sequence
        # (0 + e_0 == e_0 exactly, e_c >= 0)
        total = np.add.accumulate(e, axis=-1)[..., -1:]
        return np.divide(e, total, out=e)

    def _output_error(self, z, y):
        """dz = (softmax(z) - onehot(y)) / b, the display loss and the correct count."""
        n, b = y.shape
        p = self.softmax(z)
        sel = (np.arange(n)[:, None], np.arange(b)[None, :], y)
        py = p[sel]
        loss = -np.log(np.maximum(py, 1e-300)).mean(axis=1)  # display only
        correct = (z.argmax(axis=-1) == y).sum(axis=1)
        p[sel] = py - 1.0  # p - onehot: p - 0 == p exactly elsewhere
        p /= float(b)
        return p, loss, correct

    # ----------------------------------------------------------------- backward
    def grad(self, theta: np.ndarray, x: np.ndarray, y: np.ndarray, frac_bits: int,
             limit: float) -> Result:
        """Fixed-point gradient contribution of the micro-batches x (n, b, ...), y (n, b)."""
        if self.fast is not None:
            return Result(*self.fast.grad(theta, x, y, frac_bits, limit))
        n, b = y.shape
        z, (cache, emb) = self._forward_reference(theta, x)
        dz, loss, correct = self._output_error(z, y)
        eg = quant_exponent(_absmax(dz))
        G = quantize(dz, _per_mb(eg, 3))  # (n, b, out) int8 errors

        out = np.zeros(self.layout.size, np.int64)
        for k in range(len(cache) - 1, -1, -1):
            pi, a_in, ex, Wq, ew, _ = cache[k]
            self._weight_grad(out, pi, G, a_in, eg + ex, frac_bits, limit)
            db = G.sum(axis=1)  # (n, out) exact small integers, exponent eg
            self._accumulate(out, pi + 1, db, eg, frac_bits, limit)
            if k == 0 and emb is None:
                break
            dX = self._mm(G, Wq)  # (n, b, in), exponent eg + ew
            dexp_x = eg + ew
            if k == 0:  # into the embedding: scatter-add rows, integers, exponent dexp_x
                epi, tokens = emb
                V, D = self.layout.shapes[epi]
                dXi = dX.astype(np.int64).reshape(n, -1, D)
                dE = np.zeros((n, V, D), np.int64)
                flat = tokens.reshape(n, -1)
                for i in range(n):
                    np.add.at(dE[i], flat[i], dXi[i])
                self._accumulate(out, epi, dE.astype(np.float64), dexp_x, frac_bits, limit)
                break
            relu_out = cache[k - 1][5]
            if relu_out is not None:
                dX = dX * (relu_out > 0)
            s = np.maximum(exponent(_absmax(dX)) - 7, 0)
            G = self._requantize(dX, s)
            eg = dexp_x + s
        return Result(out, loss, correct)

    def _weight_grad(self, out, pi, G, a_in, e, frac_bits, limit):
        """dW = G^T a per micro-batch (exponent e), into the fixed-point sum.

        Fast path, same bits: when every micro-batch's scale 2**(e + S) is an integer and no
        element can reach the clamp (|dW| <= b * 127 * 127), each fixed-point value is the
        exact integer G^T a * 2**(e + S) and needs no rounding, so the sum over micro-batches
        can be folded into one float64 GEMM over all (micro-batch, sample) rows: every term
        and partial sum is an integer below 2**51, exact in any order."""
        k = np.asarray(e) + frac_bits
        b = G.shape[1]
        if (self.gemm == "fast" and int(k.min()) >= 0
                and float(b) * 16129.0 * float(pow2(int(k.max()))) <= limit):
            kmin = int(k.min())
            spread = int(k.max()) - kmin
            # float32 is exact too when every partial sum stays below 2**24
            dt = np.float32 if G.shape[0] * b * 16129 << spread <= 2**24 else np.float64
            Gs = (G * _per_mb(pow2(k - kmin), 3)).astype(dt)  # (n, b, out), exact
            total = np.matmul(Gs.reshape(-1, G.shape[2]).T, a_in.reshape(-1, a_in.shape[2]).astype(dt))
            o = self.layout.offsets[pi]
            out[o:o + total.size] += (total.astype(np.float64) * pow2(kmin)).astype(np.int64).ravel()
            return
        dW = self._mm(G.transpose(0, 2, 1), a_in)  # (n, out, in), exponent e
        self._accumulate(out, pi, dW, e, frac_bits, limit)

    def _accumulate(self, out, pi, ints, e, frac_bits, limit):
        """out[tensor] += sum over micro-batches of clamp-then-round(ints * 2**(e + S))."""
        x = ints * _per_mb(pow2(np.asarray(e) + frac_bits), ints.ndim)
        np.minimum(x, limit, out=x)
        np.maximum(x, -limit, out=x)
        x += 0.5
        q = np.floor(x, out=x).astype(np.int64)
        o = self.layout.offsets[pi]
        out[o:o + q[0].size] += q.reshape(q.shape[0], -1).sum(axis=0)

    def predict(self, theta: np.ndarray, x: np.ndarray, micro_batch: int) -> np.ndarray:
        """Class predictions for x (N, ...), evaluated in consecutive micro-batches."""
        preds = []
        for i in range(0, len(x), micro_batch):
            z, _ = self.forward(theta, x[i:i + micro_batch][None])
            preds.append(z[0].argmax(axis=-1))
        return np.concatenate(preds) if preds else np.zeros(0, np.int64)

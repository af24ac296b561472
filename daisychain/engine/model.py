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

from daisychain.engine.detmath import dexp, exponent, mse_output_error, pow2, quant_exponent, quantize, zero_sum_errors
from daisychain.engine.layer_base import BIAS_LIMIT, Back, Flow  # noqa: F401 (BIAS_LIMIT: the public name)
from daisychain.engine.layers import kind_of
from daisychain.engine.paths import choose
from daisychain.engine.spec import ModelSpec
from daisychain.engine.sround import quantize_errors, row_keys, sample_keys
from daisychain.units import reference as ref
from daisychain.units.gemm import MAX_K, MAX_K_FLOAT32, gemm_lut, require_exact_mul, tables_are_exact
from daisychain.units.luts import LutSet

IMAGE_EXPONENT = -7  #: an image's input exponent: a = pixel >> 1 means a * 2**-7


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
    """Uniform(-bound, bound) from the integer PRNG, the bound given by the layer's kind
    (1/sqrt(fan_in) for a linear's or conv's weight and bias, torch's default; 1 for an
    embedding). Stream = canonical tensor index."""
    from daisychain.engine import prng

    layout = ParamLayout(spec)
    theta = np.empty(layout.size, np.float64)
    idx = 0
    for layer in spec.layers:
        kind = kind_of(layer)
        for bound in kind.init_bounds(layer):
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
        self.exp_t = luts.exp.astype(np.float64)  # the transformer's softmax (attention.py)
        if gemm not in ("fast", "lut"):
            raise ValueError("gemm must be 'fast' or 'lut'")
        if gemm == "fast":
            require_exact_mul(luts)
        self.gemm = gemm
        # requantize by arithmetic (clamp(floor(acc * 2**-s + 1/2))): the same values as the
        # table route when the table is exactly its definition (docs/UNITS.md); "lut" reads it
        self.rq_arith = gemm == "fast" and tables_are_exact(luts)
        self.first_param = []  # per layer: index of its first parameter tensor
        pi = 0
        for layer in spec.layers:
            self.first_param.append(pi)
            pi += kind_of(layer).params
        # The compute path (engine/paths.py): the first that accepts the spec. The compiled
        # ones compute requantize and ReLU by arithmetic, valid only when their tables are
        # exactly their definitions (rq_arith). It is opened into its attribute: ``fast``
        # (dense, engine/fast.py), ``conv_fast`` (image, engine/convfast.py, needs numba) or
        # ``attn_ops`` (the transformer's per-row rules compiled, engine/attnfast.py; None
        # takes the numpy rules); ``whole`` is the one that runs whole steps, or None.
        self.path = choose(spec, self.rq_arith)
        self.fast = self.conv_fast = self.attn_ops = None
        opened = self.path.open(spec, self.layout)
        if self.path.attr is not None:
            setattr(self, self.path.attr, opened)
        self.whole = opened if self.path.whole else None

    # ----------------------------------------------------------------- unit ops
    def _mm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Batched unit GEMM: (n, M, K) x (K, N) or (n, K, N) -> (n, M, N) exact integers."""
        if self.gemm == "lut":  # K split into chunks whose int32 sums cannot overflow, summed in int64
            bb = np.broadcast_to(b, (a.shape[0],) + b.shape[-2:])
            K = a.shape[-1]
            return np.stack([sum(gemm_lut(a[i, :, k:k + MAX_K].astype(np.int64),
                                          bb[i, k:k + MAX_K].astype(np.int64), self.luts).astype(np.int64)
                                 for k in range(0, K, MAX_K))
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
        if self.rq_arith:  # exact for |acc| < 2**52: a power-of-two scaling, + 1/2, floor
            x = np.multiply(acc, pow2(-s))
            x += 0.5
            np.floor(x, out=x)
            return np.clip(x, -127.0, 127.0, out=x)
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
        if self.whole is not None and trace is None:
            got = self.whole.forward(theta, x)
            if got is not None:  # None: the path hands this call to the literal one
                return got
        return self._forward_reference(theta, x, trace)

    def _forward_reference(self, theta, x, trace=None):
        """The literal forward pass, layer by layer through the registry: every requantize
        and ReLU read from its table. Returns the logits and one cache entry per layer."""
        tr = trace.append if trace is not None else (lambda item: None)
        params = self.layout.views(theta)
        spec = self.spec
        n = x.shape[0]
        if spec.input_kind == "dense":
            ex = quant_exponent(_absmax(x))  # (n,)
            a = quantize(x, _per_mb(ex, x.ndim))
        elif spec.input_kind == "image":  # uint8 pixels: a = x >> 1, exponent -7
            a = np.floor_divide(np.asarray(x, np.int64), 2).astype(np.float64)
            ex = np.full(n, IMAGE_EXPONENT, np.int64)
        else:  # token ids: the embedding reads them
            a, ex = x, None
        if spec.input_kind != "tokens":
            tr(("input_exponent", ex))
            tr(("input_q", a))
        st = Flow(a, ex, tr, tracing=trace is not None)
        cache = []
        last = len(spec.layers) - 1
        for li, layer in enumerate(spec.layers):
            pi = self.first_param[li]
            kind = kind_of(layer)
            st.last = li == last
            cache.append(kind.forward(self, layer, li, params[pi:pi + kind.params], st))
        return st.logits, cache

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
        """dz = (softmax(z) - onehot(y)) / b, the display loss and the correct count (the
        mean squared error's: :func:`mse_output_error`)."""
        if self.spec.loss == "mse":
            return mse_output_error(z, y)
        n, b = y.shape
        p = self.softmax(z)
        sel = (np.arange(n)[:, None], np.arange(b)[None, :], y)
        py = p[sel]
        loss = -np.log(np.maximum(py, 1e-300)).mean(axis=1)  # display only
        correct = (z.argmax(axis=-1) == y).sum(axis=1)
        p[sel] = py - 1.0  # p - onehot: p - 0 == p exactly elsewhere
        p /= float(b)
        return p, loss, correct

    def top_errors(self, z, x, y):
        """The output layer's int8 errors from the logits z (n, rows, C) of inputs x, labels y
        (n, b): (G, eg, loss, correct). Cross-entropy's are made zero-sum per row; a sequence
        model's (every position predicts the next token) round stochastically (engine/sround.py)."""
        keys = None
        if self.spec.seq:
            if self.attn_ops is not None and self.spec.loss == "cross_entropy":
                got = self.attn_ops.output_error(z, x, y)
                if got is not None:  # the same values, compiled (engine/attnfast.py), zero-sum
                    return got
            keys = row_keys(x, y) if self.spec.loss == "cross_entropy" else None
            y = seq_targets(x, y)
        dz, loss, correct = self._output_error(z, y)
        if keys is not None:
            G, eg = quantize_errors(dz, keys)
        else:
            eg = quant_exponent(_absmax(dz))
            G = quantize(dz, _per_mb(eg, 3))  # (n, b, out) int8 errors
        if self.spec.loss == "cross_entropy":
            G = zero_sum_errors(G, y)  # zero-sum per sample, as the true softmax error
        return G, eg, loss, correct

    # ----------------------------------------------------------------- backward
    def grad(self, theta: np.ndarray, x: np.ndarray, y: np.ndarray, frac_bits: int,
             limit: float) -> Result:
        """Fixed-point gradient contribution of the micro-batches x (n, b, ...), y (n, b)."""
        if self.whole is not None:
            got = self.whole.grad(theta, x, y, frac_bits, limit)
            if got is not None:
                return Result(*got)
        z, cache = self._forward_reference(theta, x)
        G, eg, loss, correct = self.top_errors(z, x, y)
        out = np.zeros(self.layout.size, np.int64)
        keys = sample_keys(x, y) if self.spec.seq and self.spec.loss == "cross_entropy" else None
        bw = Back(G, eg, False, out, frac_bits, limit, keys)  # keys: the errors round stochastically
        for li in range(len(self.spec.layers) - 1, -1, -1):
            layer = self.spec.layers[li]
            kind_of(layer).backward(self, layer, li, self.first_param[li], cache[li], bw)
        return Result(out, loss, correct)

    def _weight_grad(self, out, pi, G, a_in, e, frac_bits, limit):
        """dW = G^T a per micro-batch (exponent e), into the fixed-point sum.

        Fast path, same bits: when every micro-batch's scale 2**(e + S) is an integer and no
        element can reach the clamp (|dW| <= b * 127 * 127), each fixed-point value is the
        exact integer G^T a * 2**(e + S) and needs no rounding, so the sum over micro-batches
        can be folded into one float64 GEMM over all (micro-batch, sample) rows: every term
        and partial sum is an integer below 2**51, exact in any order."""
        if self.attn_ops is not None and self.attn_ops.fold_grad(self, out, pi, G, a_in, e, frac_bits, limit):
            return  # the same integers as below, by exact int8 GEMMs (engine/attnfast.py)
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
        if self.attn_ops is not None:  # the same sums, one compiled loop (engine/attnfast.py)
            return self.attn_ops.accumulate(self, out, pi, ints, e, frac_bits, limit)
        x = ints * _per_mb(pow2(np.asarray(e) + frac_bits), ints.ndim)
        np.minimum(x, limit, out=x)
        np.maximum(x, -limit, out=x)
        x += 0.5
        q = np.floor(x, out=x).astype(np.int64)
        o = self.layout.offsets[pi]
        out[o:o + q[0].size] += q.reshape(q.shape[0], -1).sum(axis=0)

    def predict(self, theta: np.ndarray, x: np.ndarray, micro_batch: int) -> np.ndarray:
        """Class predictions for x (N, ...), evaluated in consecutive micro-batches (an
        "mse" model: its outputs, (N, outputs) float64)."""
        if self.spec.loss == "mse":
            return self.outputs(theta, x, micro_batch)
        preds = []
        for i in range(0, len(x), micro_batch):
            z = self.outputs(theta, x[i:i + micro_batch], micro_batch)
            preds.append(z.argmax(axis=-1))
        return np.concatenate(preds) if preds else np.zeros(0, np.int64)

    def outputs(self, theta: np.ndarray, x: np.ndarray, micro_batch: int) -> np.ndarray:
        """The dequantized last-layer outputs (logits) for x (N, ...): (N, classes); a
        sequence model's at the last position (the token after the full window)."""
        parts = [self.last_logits(self.forward(theta, x[i:i + micro_batch][None])[0])[0]
                 for i in range(0, len(x), micro_batch)]
        return np.concatenate(parts) if parts else np.zeros((0, self.spec.classes))

    def last_logits(self, z: np.ndarray) -> np.ndarray:
        """Logits (n, rows, C) -> (n, b, C): a sequence model's last position of each sample."""
        if not self.spec.seq:
            return z
        T = self.spec.input_dim
        return z.reshape(z.shape[0], -1, T, z.shape[-1])[:, :, -1]


def seq_targets(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A sequence model's targets: row (s, t) predicts x[s, t+1], the last position y[s].
    x (n, b, T) token ids, y (n, b) -> (n, b*T)."""
    n, b, T = x.shape
    return np.concatenate([x[..., 1:], y[..., None]], axis=-1).reshape(n, b * T).astype(np.int64)

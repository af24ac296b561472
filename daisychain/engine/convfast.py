"""The engine's fast path for image models (conv2d, maxpool2d, linear, relu): the same bits
as the literal layer-by-layer engine (engine/layers.py), held to it by tests/engine/test_conv*.py.

Why it is the same:

* Every GEMM is an exact int8 x int8 -> int32 product (engine/int8mm.py: torch's ``_int_mm``,
  or its float32 GEMM over K chunks of at most 1024, whichever is faster here): exact integer
  sums (the spec's bounds keep every accumulator below 2**31; a weight gradient whose inner
  size b*H*W could pass that is split into chunks of at most MAX_K rows, summed in int64).
* Activations are held NHWC ((n*b*H*W, C) rows, the conv's own output layout) instead of
  the spec's channel-major vectors, and im2col's columns in the order (dy, dx, ci) instead
  of (ci, dy, dx): an exact integer sum does not depend on the order of its terms, so the
  conv weight is permuted to match (and a linear after a map reads its weight's columns in
  (y, x, c) order); each gradient element is stored back at its canonical index.
* Requantize with the exact tables is ``clamp((v + 2**(s-1)) >> s, lo, 127)`` (docs/UNITS.md;
  lo = 0 when a ReLU follows), ``s`` from the micro-batch's max |v| as in the reference;
  the backward ReLU mask is taken before the shift, as in the reference.
* Each micro-batch's weight gradient is its exact integer dW_j, then the fixed-point value
  floor(clamp(dW_j * 2**(e_j + S), -L, L) + 1/2) per element in float64 in the reference's
  order (``Engine._accumulate``), summed over micro-batches in int64.
* The loss, softmax and quantization of the output error are the compiled
  kernels (the same float64 operations as the reference).

Needs numba (engine/kernels.py and the loops below); without it, or where a
kernel's preconditions fail, the engine takes the reference path (same bits).
"""

from __future__ import annotations

import math

import numpy as np

from daisychain.compiled import built_once, numba_jit
from daisychain.engine import detmath
from daisychain.engine import int8mm
from daisychain.engine import kernels as shared
from daisychain.engine.layers import kind_of
from daisychain.units.gemm import MAX_K

_EXP_LIMIT = 900


def _nb_im2col(a, n_img, H, W, C, k, cols):
    """cols[(s*H + y)*W + x, (dy*k + dx)*C + c] = a[(s*H + y+dy-p)*W + x+dx-p, c] (0 outside)."""
    p = (k - 1) // 2
    for s in range(n_img):
        for y in range(H):
            for x in range(W):
                r = (s * H + y) * W + x
                for dy in range(k):
                    yy = y + dy - p
                    for dx in range(k):
                        xx = x + dx - p
                        base = (dy * k + dx) * C
                        if 0 <= yy < H and 0 <= xx < W:
                            src = (s * H + yy) * W + xx
                            for c in range(C):
                                cols[r, base + c] = a[src, c]
                        else:
                            for c in range(C):
                                cols[r, base + c] = 0


def _nb_col2im(d, n_img, H, W, C, k, out):
    """The adjoint of _nb_im2col: out[src, c] += sum of d[r, (dy*k+dx)*C + c] over the rows r
    that read src (out comes zeroed; exact int32 sums: at most k*k terms of |Co * 127 * 127|,
    spec-bounded)."""
    p = (k - 1) // 2
    for s in range(n_img):
        for y in range(H):
            for x in range(W):
                r = (s * H + y) * W + x
                for dy in range(k):
                    yy = y + dy - p
                    if yy < 0 or yy >= H:
                        continue
                    for dx in range(k):
                        xx = x + dx - p
                        if xx < 0 or xx >= W:
                            continue
                        dst = (s * H + yy) * W + xx
                        base = (dy * k + dx) * C
                        for c in range(C):
                            out[dst, c] += d[r, base + c]


def _nb_rq_fwd(acc, bias, ex, ew, rows, lo, out, ex_out, bacc):
    """Per micro-batch j (acc rows j*rows ..): v = acc + bacc, s = max(0, bitlen(max|v|) - 7),
    out = clamp((v + half) >> s, lo, 127) (int8); ex_out[j] = ex[j] + ew + s."""
    n = ex.shape[0]
    cols = acc.shape[1]
    for j in range(n):
        sexp = ex[j] + ew
        if not shared._nb_bias_acc(bias, sexp, bacc):
            return False
        am = np.int64(0)
        for r in range(j * rows, j * rows + rows):
            for o in range(cols):
                v = np.int64(acc[r, o]) + bacc[o]
                if v < 0:
                    v = -v
                if v > am:
                    am = v
        s = shared._nb_bitlen(am) - 7
        if s < 0:
            s = 0
        half = (np.int64(1) << s) >> 1
        for r in range(j * rows, j * rows + rows):
            for o in range(cols):
                q = (np.int64(acc[r, o]) + bacc[o] + half) >> s
                if q > 127:
                    q = 127
                if q < lo:
                    q = lo
                out[r, o] = q
        ex_out[j] = sexp + s
    return True


def _nb_rq_back(v, mask, use_mask, rows, eg, ew, out, eg_out):
    """Per micro-batch j: v = 0 where use_mask and mask <= 0 (the ReLU before), s =
    max(0, bitlen(max|v|) - 7), out = clamp((v + half) >> s, -127, 127) (int8);
    eg_out[j] = eg[j] + ew + s."""
    n = eg.shape[0]
    cols = v.shape[1]
    for j in range(n):
        am = np.int64(0)
        for r in range(j * rows, j * rows + rows):
            for c in range(cols):
                x = np.int64(v[r, c])
                if use_mask and mask[r, c] <= 0:
                    x = 0
                    v[r, c] = 0
                if x < 0:
                    x = -x
                if x > am:
                    am = x
        s = shared._nb_bitlen(am) - 7
        if s < 0:
            s = 0
        half = (np.int64(1) << s) >> 1
        for r in range(j * rows, j * rows + rows):
            for c in range(cols):
                q = (np.int64(v[r, c]) + half) >> s
                if q > 127:
                    q = 127
                if q < -127:
                    q = -127
                out[r, c] = q
        eg_out[j] = eg[j] + ew + s


def _nb_pool(a, n_img, H, W, C, out, arg):
    """2x2 max pool on NHWC rows; arg = the first of (0,0), (0,1), (1,0), (1,1) holding the max."""
    H2, W2 = H // 2, W // 2
    for s in range(n_img):
        for Y in range(H2):
            for X in range(W2):
                o = (s * H2 + Y) * W2 + X
                r0 = (s * H + 2 * Y) * W + 2 * X
                for c in range(C):
                    best = a[r0, c]
                    bi = 0
                    for t in range(1, 4):
                        v = a[r0 + (t >> 1) * W + (t & 1), c]
                        if v > best:
                            best = v
                            bi = t
                    out[o, c] = best
                    arg[o, c] = bi


def _nb_pool_back(g, arg, n_img, H, W, C, mask, use_mask, out):
    """out (NHWC rows of the pool input, comes zeroed) = g at each window's argmax; 0 where
    use_mask and mask <= 0 (the ReLU before the pool)."""
    H2, W2 = H // 2, W // 2
    for s in range(n_img):
        for Y in range(H2):
            for X in range(W2):
                o = (s * H2 + Y) * W2 + X
                r0 = (s * H + 2 * Y) * W + 2 * X
                for c in range(C):
                    t = arg[o, c]
                    dst = r0 + (t >> 1) * W + (t & 1)
                    if use_mask and mask[dst, c] <= 0:
                        continue
                    out[dst, c] = g[o, c]


def _nb_fixed_add(dW, e, frac_bits, limit, dst, perm):
    """dst[perm[i]] += floor(clamp(dW_i * 2**(e + S), -L, L) + 1/2) for the flat index i of
    dW (2-D), the reference's _accumulate order. False for |e + S| > _EXP_LIMIT."""
    k = e + frac_bits
    if k > _EXP_LIMIT or k < -_EXP_LIMIT:
        return False
    p = math.ldexp(1.0, k)
    R, K = dW.shape
    for r in range(R):
        for c in range(K):
            t = np.float64(dW[r, c]) * p
            if t > limit:
                t = limit
            if t < -limit:
                t = -limit
            t = t + 0.5
            t = np.floor(t)
            dst[perm[r * K + c]] += np.int64(t)
    return True


class _K:
    pass


def _build():
    """The compiled loops (with engine/kernels.py's), or None without numba."""
    base = shared.compiled()
    jit = numba_jit()
    if base is None or jit is None:
        return None
    k = _K()
    k.base = base  # kernels.py's kernels (its helpers _nb_bias_acc, _nb_bitlen are compiled now)
    for name in ("im2col", "col2im", "rq_fwd", "rq_back", "pool", "pool_back", "fixed_add"):
        setattr(k, name, jit(globals()["_nb_" + name]))
    return k


kernels = built_once(_build)


def _fresh(key, shape, dtype, zero=False):
    """A new array (``ConvFastPath._buf``'s signature): forward's results outside grad."""
    return np.zeros(shape, dtype) if zero else np.empty(shape, dtype)


class ConvFastPath:
    """Plan of an image model (every layer conv2d, maxpool2d, linear or relu): per layer
    ("conv" | "pool" | "linear", layer index, facts)."""

    def __init__(self, spec, layout):
        import torch

        self._torch = torch
        self._scratch: dict = {}
        self.layout = layout
        self.spec = spec
        layers = spec.layers
        self.plan = []
        pi = 0
        c, h, w = spec.image
        shape = ("map", c, h, w)
        for li, l in enumerate(layers):
            low = kind_of(l).lower(l, li, layers)  # the kind's op (engine/layers.py); None: a folded relu
            if low is None:
                continue
            op, f = low
            if op == "conv":
                ci, co, k = f["ci"], f["co"], f["k"]
                f.update(pi=pi, perm=np.arange(co * ci * k * k).reshape(co, ci, k, k).transpose(0, 2, 3, 1).ravel())
                shape = ("map", co, f["h"], f["w"])
                pi += 2
            elif op == "pool":
                shape = ("map", f["c"], f["h"] // 2, f["w"] // 2)
            else:  # "linear"
                n_in, n_out = f["n_in"], f["n_out"]
                if shape[0] == "map":
                    _, mc, mh, mw = shape
                    perm = np.arange(n_out * n_in).reshape(n_out, mc, mh, mw).transpose(0, 2, 3, 1).ravel()
                else:
                    perm = np.arange(n_out * n_in)
                f.update(pi=pi, perm=perm, last=li == len(layers) - 1)
                shape = ("flat", n_out)
                pi += 2
            self.plan.append((op, li, f))

    def _buf(self, key, shape, dtype, zero=False):
        """This path's scratch array ``key`` (reused between grad calls: an Engine, so its
        path, is never shared between threads; a call's arrays never outlive it), zeroed when
        asked. Reuse keeps the step's large arrays in memory already mapped and cached:
        fresh ones cost page faults and, with threads, contention in the kernel."""
        arr = self._scratch.get(key)
        if arr is None or arr.shape != shape or arr.dtype != dtype:
            arr = self._scratch[key] = np.empty(shape, dtype)
        if zero:
            arr.fill(0)
        return arr

    def _mm(self, a, b, key=None):
        """Exact int8 x int8 -> int32 GEMM (numpy in and out, no copies of contiguous operands;
        the product into scratch ``key`` when given).

        torch 2.13's CPU ``_int_mm`` returns garbage for a one-row operand whose strides are
        (1, 1) (what numpy gives a transposed (K, 1) array): any dimension of size 1 takes an
        exact numpy int64 product instead."""
        if min(a.shape[0], a.shape[1], b.shape[1]) < 2:
            return (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
        if key is None:
            return int8mm.mm(a, b)
        return int8mm.mm(a, b, self._buf(key, (a.shape[0], b.shape[1]), np.int32))

    def _wgrad(self, kern, G, A, rows, eg, ex, frac_bits, limit, dst, perm, key=None):
        """dst[perm] += the fixed-point weight gradient G^T A of each micro-batch (rows each);
        a micro-batch of one chunk takes its product into scratch ``key``."""
        n = eg.shape[0]
        for j in range(n):
            r0 = j * rows
            dW = None
            for c0 in range(r0, r0 + rows, MAX_K):  # int32-safe chunks, summed exactly in int64
                c1 = min(c0 + MAX_K, r0 + rows)
                part = self._mm(G[c0:c1].T, A[c0:c1], key if c1 - c0 == rows else None)
                dW = part if dW is None else dW.astype(np.int64) + part
            if not kern.fixed_add(dW, int(eg[j] + ex[j]), frac_bits, limit, dst, perm):
                return False
        return True

    def forward(self, theta, x, kern=None, scratch=False):
        """Logits (n, b, classes) float64 and the cache, or None (take the reference path).
        ``scratch``: the arrays are this path's scratch (grad's call: they live until the
        next call)."""
        kern = kern or kernels()
        if kern is None:
            return None
        new = self._buf if scratch else _fresh
        n, b = x.shape[0], x.shape[1]
        c, h, w = self.spec.image
        nb = n * b
        a = np.ascontiguousarray((np.asarray(x, np.uint8) >> 1).astype(np.int8)
                                 .reshape(nb, c, h * w).transpose(0, 2, 1)).reshape(nb * h * w, c)
        ex = np.full(n, -7, np.int64)
        cache = []
        base = kern.base
        for kind, li, f in self.plan:
            if kind == "pool":
                H2, W2 = f["h"] // 2, f["w"] // 2
                out = new(("pool", li), (nb * H2 * W2, f["c"]), np.int8)
                arg = new(("arg", li), (nb * H2 * W2, f["c"]), np.int8)
                kern.pool(a, nb, f["h"], f["w"], f["c"], out, arg)
                cache.append((a, ex, arg))
                a = out
                continue
            ow, ob = self.layout.offsets[f["pi"]], self.layout.offsets[f["pi"] + 1]
            W = theta[ow:ob]
            bias = theta[ob:ob + (f["co"] if kind == "conv" else f["n_out"])]
            Wq32 = new(("wq32", li), (1, W.size), np.float32)
            ewv = new(("ew", li), (1,), np.int64)
            if not base.quant_rows(np.ascontiguousarray(W).reshape(1, -1), Wq32, ewv):
                return None
            ew = int(ewv[0])
            n_out = f["co"] if kind == "conv" else f["n_out"]
            Wq = new(("wq", li), (n_out, W.size // n_out), np.int8)  # in our column order
            Wq.reshape(-1)[:] = np.take(Wq32.reshape(-1), f["perm"], out=new(("wqp", li), (W.size,), np.float32))
            if kind == "conv":  # Wq (Co, k*k*Ci)
                rows_img = f["h"] * f["w"]
                cols = new(("cols", li), (nb * rows_img, Wq.shape[1]), np.int8)
                kern.im2col(a, nb, f["h"], f["w"], f["ci"], f["k"], cols)
                acc = self._mm(cols, Wq.T, ("acc", li) if scratch else None)
                out = new(("out", li), acc.shape, np.int8)
                ex_out = new(("ex", li), (n,), np.int64)
                if not kern.rq_fwd(acc, bias, ex, ew, b * rows_img, 0 if f["relu"] else -127, out, ex_out,
                                   new(("bacc", li), (n_out,), np.int64)):
                    return None
                cache.append((a, ex, cols, Wq, ew))
                a, ex = out, ex_out
                continue
            a2 = a.reshape(nb, -1)  # Wq (out, F)
            acc = self._mm(a2, Wq.T, ("acc", li) if scratch else None)
            cache.append((a2, ex, Wq, ew))
            if f["last"]:
                z = new(("z", li), acc.shape, np.float64)
                if not base.logits(acc, bias, ex, ew, b, z, new(("bacc", li), (n_out,), np.int64)):
                    return None
                return z.reshape(n, b, -1), cache
            out = new(("out", li), acc.shape, np.int8)
            ex_out = new(("ex", li), (n,), np.int64)
            if not kern.rq_fwd(acc, bias, ex, ew, b, 0 if f["relu"] else -127, out, ex_out,
                               new(("bacc", li), (n_out,), np.int64)):
                return None
            a, ex = out, ex_out
        return None

    def grad(self, theta, x, y, frac_bits, limit):
        """(fixed-point gradient int64, loss (n,), correct (n,)), or None (take the reference)."""
        kern = kernels()
        got = self.forward(theta, x, kern, scratch=True) if kern is not None else None
        if got is None:
            return None
        z, cache = got
        base = kern.base
        n, b, C = z.shape
        nb = n * b
        dz = np.empty((n, b * C))
        py = np.empty((n, b))
        correct = np.empty(n, np.int64)
        yv = np.ascontiguousarray(np.asarray(y).reshape(-1), dtype=np.int64)
        if not base.output_error(z.reshape(nb, C), yv, b, dz.reshape(nb, C), py.reshape(-1), correct):
            return None
        eg = np.empty(n, np.int64)
        G32 = np.empty((n, b * C), np.float32)
        if not base.quant_rows(dz, G32, eg):
            return None
        t = np.log(np.maximum(py, 1e-300))  # the display loss, as in output_error
        loss = -(np.add.reduce(t, axis=1) / b)
        G = detmath.zero_sum_errors(G32.reshape(nb, C), yv).astype(np.int8)
        out = np.zeros(self.layout.size, np.int64)
        off = self.layout.offsets
        for idx in range(len(self.plan) - 1, -1, -1):
            kind, li, f = self.plan[idx]
            if kind == "pool":
                a_in, _, arg = cache[idx]
                if li == 0:
                    break
                Gp = self._buf(("gp", li), a_in.shape, np.int8, zero=True)
                kern.pool_back(G, arg, nb, f["h"], f["w"], f["c"], a_in, f["mask"], Gp)
                G = Gp
                continue
            pi = f["pi"]
            wdst = out[off[pi]:off[pi + 1]]
            n_out = f["co"] if kind == "conv" else f["n_out"]
            bdst = out[off[pi + 1]:off[pi + 1] + n_out]
            rows = b * (f["h"] * f["w"] if kind == "conv" else 1)
            if not base.bias_grad(G, rows, eg, frac_bits, limit, bdst, self._buf(("bg", li), (n_out,), np.int64)):
                return None
            if kind == "conv":
                a_in, ex, cols, Wq, ew = cache[idx]
                A = cols
            else:
                a_in, ex, Wq, ew = cache[idx]
                A = a_in
            if not self._wgrad(kern, G, A, rows, eg, ex, frac_bits, limit, wdst, f["perm"], ("dw", li)):
                return None
            if li == 0:
                break
            d = self._mm(G, Wq, ("d", li))  # (rows, K) int32, exponent eg + ew
            if kind == "conv":
                dX = self._buf(("dx", li), a_in.shape, np.int32, zero=True)
                kern.col2im(d, nb, f["h"], f["w"], f["ci"], f["k"], dX)
            else:
                dX = d  # (nb, F), the layout of a_in
            Gn = self._buf(("gn", li), dX.shape, np.int8)
            eg_out = self._buf(("eg", li), (n,), np.int64)
            kern.rq_back(dX, a_in, f["mask"], dX.shape[0] // n, eg, ew, Gn, eg_out)
            G, eg = Gn, eg_out
            if kind == "linear" and idx > 0 and self.plan[idx - 1][0] != "linear":
                below = self.plan[idx - 1][2]  # a map below: back to its NHWC rows (nb*H*W, C)
                G = G.reshape(-1, below["co"] if "co" in below else below["c"])
        return out, loss, correct

"""The transformer's layer kinds (docs/ENGINE.md, "The transformer"): ``posembed`` (position
embeddings added to the token embeddings), ``block`` (pre-norm causal multi-head attention
and a ReLU MLP, each with a residual align-add) and ``rmsnorm`` (the final norm). The
registry (engine/layers.py) imports this module and adds ``KINDS``; the kinds' shared parts
are ``engine/layer_base.py``.

Activations after the posembed are rows (n, b*T, D), row s*T + t; the residual stream is
wide (|v| <= 2**15, an exponent per micro-batch, ``norm.align_add``). Every product goes
through ``eng._mm``, every int8 requantize through ``eng._requantize``, every ReLU through
``eng._relu``, every exp through the exp unit's table ``eng.exp_t``; the rest is the integer
arithmetic of engine/norm.py.
"""

from __future__ import annotations

import re

import numpy as np

from daisychain.engine import norm as N
from daisychain.engine import sround
from daisychain.engine.detmath import pow2, quant_exponent, quantize
from daisychain.engine.layer_base import Layer, LayerKind, SpecError, _affine_am, _trace_affine

MAX_HEADS = 64
MIN_WIDTH, MAX_WIDTH = 8, 1024
MAX_HEAD_DIM = 256
MAX_MLP = 4096
#: at most this many attention scores (b * H * T^2) per micro-batch: bounds the memory a
#: spec from elsewhere makes an engine allocate
MAX_SCORES = 2**26
BLOCK_TENSORS = ("q", "k", "v", "o", "fc1", "fc2")


def _int(obj, key):
    return int(obj[key])


def _rq8(eng, V, e, am=None, f32=False, sk=None):
    """requantize to int8 with s = max(0, bitlen(max|V|) - 7) per micro-batch: (int8, e + s).
    (For |V| >= 2**31 an int32 engine first floors by 2**t1, t1 = max(0, s - 23): the same
    result; numpy's float routing is exact for any |V| < 2**53.) ``am``: max|V| per
    micro-batch where the compiled route already took it. ``sk``: (sample keys, site) of a
    backward's error: rounded stochastically (:func:`_srq`)."""
    if sk is not None:
        return _srq(eng, sk, V, e, f32=f32)[:2]
    ops = getattr(eng, "attn_ops", None)
    if ops is not None:  # f32: float32 out for the per-head GEMMs (the same integers)
        return ops.rq8(eng, V, e, am, np.float32 if f32 else np.int8)
    s = np.maximum(N.bitlen(N.absmax(V)) - 7, 0)
    return eng._requantize(np.asarray(V, np.float64), s), np.asarray(e, np.int64) + s


def _affine_q8(eng, li, a, ex, W, bias, st, name, relu=False):
    """_affine_am, then _rq8 (then the ReLU where ``relu``): (int8 rows, e, Wq, ew). The
    compiled route does the bias, the requantize and the ReLU in one pass."""
    fast = getattr(eng, "attn_ops", None)
    if fast is None:
        acc, sexp, Wq, ew, _ = _affine_am(eng, li, a, ex, W, bias, st, name=name)
        q8, e8 = _rq8(eng, acc, sexp)
        return (eng._relu(q8) if relu else q8), e8, Wq, ew
    q8, e8, Wq, ew, bacc, acc = fast.affine_rq8(eng, a, ex, W, bias, relu, st.tracing)
    _trace_affine(st, name, ew, bacc, acc)
    return q8, e8, Wq, ew


def _affine_align(eng, li, X, ex, a, ea, W, bias, st, name):
    """_affine_am of a, then its align-add onto the stream X: (the sum, its exponent, Wq, ew).
    The compiled route adds the bias inside the align-add (no float64 sums written)."""
    fast = getattr(eng, "attn_ops", None)
    if fast is None:
        acc, sexp, Wq, ew, _ = _affine_am(eng, li, a, ea, W, bias, st, name=name)
        S, eS = N.align_add([(X, ex), (acc, sexp)])
        return S, eS, Wq, ew
    S, eS, Wq, ew, bacc, acc = fast.affine_align(eng, X, ex, a, ea, W, bias, st.tracing)
    _trace_affine(st, name, ew, bacc, acc)
    return S, eS, Wq, ew


def _align(eng, ops):
    """N.align_add, or the same values from the compiled route (engine/attnfast.py)."""
    fast = getattr(eng, "attn_ops", None)
    return (fast or N).align_add(ops)


def _mm(eng, a, b):
    """eng._mm, or the compiled route's (float32 out: the same integers, below 2**24)."""
    fast = getattr(eng, "attn_ops", None)
    return eng._mm(a, b) if fast is None else fast.mm(eng, a, b)


def _wgrad(eng, *args):
    """eng._weight_grad, or the compiled route's (the same fixed-point sum)."""
    fast = getattr(eng, "attn_ops", None)
    return eng._weight_grad(*args) if fast is None else fast.weight_grad(eng, *args)


def attn_shift(dh: int) -> int:
    """a: the scores are scaled by 2**-a, a = floor(log2(dh) / 2)."""
    return (int(dh).bit_length() - 1) >> 1


class PosEmbed(LayerKind):
    type = "posembed"
    params = 1
    sequence = True

    def from_json(self, obj):
        return Layer("posembed", _int(obj, "context"), _int(obj, "dim"))

    def to_json(self, l):
        return {"type": "posembed", "context": l.n_in, "dim": l.n_out}

    def param_shapes(self, l):
        return [("weight", (l.n_in, l.n_out))]

    def out_shape(self, l, i, shape, layers):
        if i != 1 or layers[0].type != "embedding" or shape[0] != "flat":
            raise SpecError("a posembed must come right after the model's embedding")
        T, D = l.n_in, l.n_out
        if layers[0].n_out != D or shape[1] != T * D:
            raise SpecError(f"layer {i}: posembed({T}, {D}) does not match the embedding's "
                            f"{shape[1] // max(layers[0].n_out, 1)} tokens of {layers[0].n_out}")
        return ("seq", T, D)

    def forward(self, eng, l, li, P, st):
        (Pos,) = P
        n, b = st.a.shape[0], st.a.shape[1]
        T, D = l.n_in, l.n_out
        ep = int(quant_exponent(np.abs(Pos).max()))
        Pq = quantize(Pos, ep).astype(np.int8)  # |Pq| <= 127: the tiled copy in int8
        tiled = np.broadcast_to(Pq, (n, b, T, D)).reshape(n, b * T, D)
        st.a, st.ex = _align(eng, [(st.a.reshape(n, b * T, D), st.ex), (tiled, np.full(n, ep, np.int64))])
        st.tr((f"layers.{li}.weight_exponent", ep))
        st.tr((f"layers.{li}.out", st.a))
        st.tr((f"layers.{li}.out_exponent", st.ex))
        return b

    def backward(self, eng, l, li, pi, b, bw):
        n = bw.G.shape[0]
        dP = np.asarray(bw.G).reshape(n, b, l.n_in, l.n_out).sum(axis=1)  # exact integers (int64 for ints)
        eng._accumulate(bw.out, pi, dP, bw.eg, bw.frac_bits, bw.limit)

    def torch_module(self, l):
        return _torch().PosEmbed(l.n_in, l.n_out)


class RMSNorm(LayerKind):
    """The final norm (no parameters: the output layer absorbs a gain and a shift)."""

    type = "rmsnorm"

    def from_json(self, obj):
        d = _int(obj, "dim")
        return Layer("rmsnorm", d, d, 0, _int(obj, "context"))

    def to_json(self, l):
        return {"type": "rmsnorm", "dim": l.n_in, "context": l.height}

    def out_shape(self, l, i, shape, layers):
        if shape[0] != "seq" or shape[1:] != (l.height, l.n_in):
            raise SpecError(f"layer {i}: rmsnorm({l.n_in}) needs the rows of a sequence model "
                            f"of context {l.height} and width {l.n_in}")
        return shape

    def forward(self, eng, l, li, P, st):
        ex = st.ex
        st.a, st.ex, cache = rmsnorm(eng, st.a, ex, f"layers.{li}", st)
        return cache, ex

    def backward(self, eng, l, li, pi, cache, bw):
        (nc, ex) = cache
        if bw.keys is not None and bw.acc:  # a sequence model's error rounds stochastically
            bw.G, bw.eg = _rq8(eng, bw.G, bw.eg, sk=(bw.keys, sround.site_key(li, 0)))
            bw.acc = False
        g = bw.int8(eng)
        bw.G, bw.eg = _rms_back(eng, g, bw.eg, ex, nc)
        bw.acc = True  # wide: the block above reads it as the stream error

    def units(self, l, b, li, layers):
        return 0, b * l.n_in, 0  # forward requantize (its error's is the linear's)

    def torch_module(self, l):
        return _torch().RMSNorm()


def rmsnorm(eng, x, ex, name, st):
    """rms_forward, then requantize (the unit) per micro-batch: (int8 rows, en, cache)."""
    fast = getattr(eng, "attn_ops", None)
    am = None if fast is None else np.empty(x.shape[0])  # the compiled pass takes max|y| too
    y, cache = N.rms_forward(x) if fast is None else fast.rms_forward(x, am)
    y8, s = _rq8(eng, y, np.zeros(x.shape[0], np.int64), am)
    st.tr((f"{name}.y", y))
    st.tr((f"{name}.out_q", y8))
    return y8, s - N.NORM_F, cache


def _rms_back(eng, g, eg, ex, cache):
    dx, e = (getattr(eng, "attn_ops", None) or N).rms_backward(g, eg, ex, cache)
    return dx.astype(np.float64, copy=False), e


def _srq(eng, sk, V, e, mask=None, sums=False, f32=False):
    """engine/sround.py requantize_errors with sk = (sample keys, site): the compiled loop
    (int8 out, float32 where ``f32``) on the compiled route, else through eng._requantize
    (the unit, float64 out)."""
    fast = getattr(eng, "attn_ops", None) is not None
    dt = (np.float32 if f32 else np.int8) if fast else np.float64
    return sround.requantize_errors(V, e, sk[0], sk[1], mask, sums, fast, dt, None if fast else eng._requantize)


def _rq8s(eng, V, e, mask=None, sk=None):
    """_rq8 of V * (mask > 0) (no mask: V), and the int8 out's sum over its rows per
    micro-batch (a bias gradient's integers): (int8, e + s, sums). ``sk``: as _rq8's."""
    if sk is not None:
        return _srq(eng, sk, V, e, mask, sums=True)
    fast = getattr(eng, "attn_ops", None)
    if fast is not None:
        return fast.rq8x(V, e, mask, sums=True)
    G, eG = _rq8(eng, V if mask is None else V * (mask > 0), e)
    return G, eG, G.sum(axis=1)


def _rq8_rows(eng, M, n, b, T, H, dh, e, sums=False, sk=None):
    """_rq8 of _rows(M), and (where ``sums``) the out's sum over its rows as _rq8s. ``sk``: as
    _rq8's."""
    if sk is not None:
        return _srq(eng, sk, _rows(M, n, b, T, H, dh), e, sums=sums)
    fast = getattr(eng, "attn_ops", None)
    if fast is not None:
        return fast.rq8_rows(M, n, b, T, H, dh, e, sums)
    G, eG = _rq8(eng, _rows(M, n, b, T, H, dh), e)
    return G, eG, (G.sum(axis=1) if sums else None)


class Block(LayerKind):
    """Pre-norm transformer block: X + o(attn(rmsnorm X)), then + fc2(relu(fc1(rmsnorm X)))."""

    type = "block"
    params = 12
    item = re.compile(r"block([0-9]+)h([0-9]+)")  # blockWhH: width W, H heads
    stack = "transformer"
    prefix = "block"

    def describe(self, l, i, layers):
        return f"block{l.n_in}h{l.kernel}"

    def check_size(self, l, micro_batch):
        if micro_batch * l.kernel * l.height ** 2 > MAX_SCORES:
            raise SpecError(f"block{l.n_in}h{l.kernel} at context {l.height} with --micro-batch "
                            f"{micro_batch} makes {micro_batch * l.kernel * l.height ** 2:,} "
                            f"attention scores a micro-batch, more than {MAX_SCORES:,}: use a "
                            f"smaller micro-batch, context or fewer heads")

    def from_json(self, obj):
        d = _int(obj, "dim")
        return Layer("block", d, d, _int(obj, "heads"), _int(obj, "context"), _int(obj, "mlp"))

    def to_json(self, l):
        return {"type": "block", "dim": l.n_in, "heads": l.kernel, "context": l.height, "mlp": l.width}

    def param_shapes(self, l):
        D, M = l.n_in, l.width
        out = []
        for t, shape in (("q", (D, D)), ("k", (D, D)), ("v", (D, D)), ("o", (D, D)),
                         ("fc1", (M, D)), ("fc2", (D, M))):
            out += [(f"{t}.weight", shape), (f"{t}.bias", (shape[0],))]
        return out

    def init_bounds(self, l):
        """One bound per tensor: 1/sqrt(fan_in) (D, or M for fc2)."""
        D, M = l.n_in, l.width
        return [1.0 / np.sqrt(float(M if t == "fc2" else D)) for t in BLOCK_TENSORS for _ in (0, 1)]

    def init_bound(self, l):
        return 1.0 / np.sqrt(float(l.n_in))

    def out_shape(self, l, i, shape, layers):
        D, H, T, M = l.n_in, l.kernel, l.height, l.width
        if shape[0] != "seq":
            raise SpecError(f"layer {i}: a block needs token and position embeddings before it "
                            f"(the text task)")
        if not MIN_WIDTH <= D <= MAX_WIDTH:
            raise SpecError(f"layer {i}: a block's width must lie in [{MIN_WIDTH}, {MAX_WIDTH}], not {D}")
        if not 1 <= H <= MAX_HEADS:
            raise SpecError(f"layer {i}: a block has 1 to {MAX_HEADS} heads, not {H}")
        if D % H:
            raise SpecError(f"layer {i}: width {D} is not divisible by {H} heads")
        if D // H > MAX_HEAD_DIM:
            raise SpecError(f"layer {i}: {D // H} values per head is more than {MAX_HEAD_DIM}")
        if not 1 <= M <= MAX_MLP:
            raise SpecError(f"layer {i}: a block's MLP has 1 to {MAX_MLP} units, not {M}")
        if shape[1:] != (T, D):
            raise SpecError(f"layer {i}: block{D}h{H} of context {T} on rows of context "
                            f"{shape[1]} and width {shape[2]}: every block has the embedding's width")
        return shape

    # ------------------------------------------------------------------ forward
    def forward(self, eng, l, li, P, st):
        D, H, T = l.n_in, l.kernel, l.height
        dh = D // H
        a = attn_shift(dh)
        name = f"layers.{li}"
        X, ex = st.a, st.ex
        n, R = X.shape[0], X.shape[1]
        b = R // T
        A1, en1, nc1 = rmsnorm(eng, X, ex, f"{name}.norm1", st)
        qkv, (Qh, Kh, Vh) = _qkv(eng, li, A1, en1, P, st, name, (n, b, T, H, dh))  # (n*b*H, T, dh)
        (_, eq, _, _), (_, ek, _, _), (_, ev, _, _) = qkv
        Sc = _mm(eng, Qh, Kh.transpose(0, 2, 1))  # (n*b*H, T, T), exponent eq + ek
        Pm = softmax_int(eng, Sc.reshape(n, b * H, T, T), eq + ek - a)
        st.tr((f"{name}.scores", Sc.reshape(n, b * H, T, T)))
        st.tr((f"{name}.probs", Pm))
        O = _mm(eng, Pm.reshape(n * b * H, T, T), Vh)  # (n*b*H, T, dh), exponent ev - 7
        Oa, eo, _ = _rq8_rows(eng, O, n, b, T, H, dh, ev - 7)
        st.tr((f"{name}.attn.out_q", Oa))
        X1, ex1, Wo, ewo = _affine_align(eng, li, X, ex, Oa, eo, P[6], P[7], st, f"{name}.o")
        st.tr((f"{name}.resid1", X1))
        A2, en2, nc2 = rmsnorm(eng, X1, ex1, f"{name}.norm2", st)
        H1, eh, W1, ew1 = _affine_q8(eng, li, A2, en2, P[8], P[9], st, f"{name}.fc1", relu=True)
        st.tr((f"{name}.fc1.out_q", H1))
        st.a, st.ex, W2, ew2 = _affine_align(eng, li, X1, ex1, H1, eh, P[10], P[11], st, f"{name}.fc2")
        st.tr((f"{name}.out", st.a))
        st.tr((f"{name}.out_exponent", st.ex))
        return dict(ex=ex, A1=A1, en1=en1, nc1=nc1, qkv=qkv, Qh=Qh, Kh=Kh, Vh=Vh, P=Pm, Oa=Oa, eo=eo,
                    Wo=Wo, ewo=ewo, ex1=ex1, A2=A2, en2=en2, nc2=nc2, W1=W1, ew1=ew1, H1=H1, eh=eh,
                    W2=W2, ew2=ew2, a=a, dims=(n, b, T, H, dh))

    # ------------------------------------------------------------------ backward
    def backward(self, eng, l, li, pi, c, bw):
        n, b, T, H, dh = c["dims"]
        a = c["a"]
        out, fb, lim = bw.out, bw.frac_bits, bw.limit
        E, eg = bw.G, bw.eg  # the wide stream error
        sk = ((lambda j: None) if bw.keys is None  # site j's keys: the errors round stochastically
              else (lambda j: (bw.keys, sround.site_key(li, j))))
        # MLP branch
        G3, eg3, sb = _rq8s(eng, E, eg, sk=sk(0))
        _wgrad(eng, out, pi + 10, G3, c["H1"], eg3 + c["eh"], fb, lim)
        eng._accumulate(out, pi + 11, sb, eg3, fb, lim)
        Gh, egh, sb = _rq8s(eng, _mm(eng, G3, c["W2"]), eg3 + c["ew2"], c["H1"], sk(1))  # the ReLU's mask
        _wgrad(eng, out, pi + 8, Gh, c["A2"], egh + c["en2"], fb, lim)
        eng._accumulate(out, pi + 9, sb, egh, fb, lim)
        g2, eg2 = _rq8(eng, _mm(eng, Gh, c["W1"]), egh + c["ew1"], sk=sk(2))
        E, eg = _align(eng, [(E, eg), _rms_back(eng, g2, eg2, c["ex1"], c["nc2"])])
        # attention branch
        Go, ego, sb = _rq8s(eng, E, eg, sk=sk(3))
        _wgrad(eng, out, pi + 6, Go, c["Oa"], ego + c["eo"], fb, lim)
        eng._accumulate(out, pi + 7, sb, ego, fb, lim)
        Ga, ega = _rq8(eng, _mm(eng, Go, c["Wo"]), ego + c["ewo"], sk=sk(4))
        Gah = _heads_mm(eng, Ga, n, b, T, H, dh)
        (_, eq, _, _), (_, ek, _, _), (_, ev, _, _) = c["qkv"]
        Pm = c["P"].reshape(n * b * H, T, T)
        dP = _mm(eng, Gah, c["Vh"].transpose(0, 2, 1))  # exponent ega + ev
        dV = _mm(eng, Pm.transpose(0, 2, 1), Gah)  # exponent ega - 7
        dA = softmax_back(Pm, dP, eng)  # exponent ega + ev - 14
        GS, eS = _rq8(eng, dA.reshape(n, b * H * T, T), ega + ev - 14, f32=True, sk=sk(5))
        GS = GS.reshape(n * b * H, T, T)
        dQ = _mm(eng, GS, c["Kh"])  # exponent eS + ek - a
        dK = _mm(eng, GS.transpose(0, 2, 1), c["Qh"])  # exponent eS + eq - a
        errs = []
        for j, (dM, e) in enumerate(((dQ, eS + ek - a), (dK, eS + eq - a), (dV, ega - 7))):
            Gs, egs, sb = _rq8_rows(eng, dM, n, b, T, H, dh, e, sums=True, sk=sk(6 + j))
            _, _, Wq, ew = c["qkv"][j]
            _wgrad(eng, out, pi + 2 * j, Gs, c["A1"], egs + c["en1"], fb, lim)
            eng._accumulate(out, pi + 2 * j + 1, sb, egs, fb, lim)
            errs.append(_rq8(eng, _mm(eng, Gs, Wq), egs + ew, sk=sk(9 + j)))
        g1, eg1 = _rq8(eng, *_align(eng, errs), sk=sk(12))
        E, eg = _align(eng, [(E, eg), _rms_back(eng, g1, eg1, c["ex"], c["nc1"])])
        bw.G, bw.eg, bw.acc = E, eg, True

    def units(self, l, b, li, layers):
        R, D, H, T, M = b, l.n_in, l.kernel, l.height, l.width  # b is the rows here (samples * T)
        mul = 12 * R * D * D + 6 * R * D * M + 6 * R * T * D
        rq = 6 * R * D + R * M + 11 * R * D + R * M + R * H * T
        return mul, rq, R * M

    def exp_units(self, l, b):
        return b * l.kernel * l.height * (l.height + 1) // 2

    def torch_module(self, l):
        return _torch().Block(l.n_in, l.kernel, l.width)


def _qkv(eng, li, A1, en1, P, st, name, dims):
    """The q, k and v affines, requantized: ([(rows q8, e8, Wq, ew)] per tensor, their
    head-order operands). The compiled route makes them as one GEMM and writes the
    head-order float32 operands in the requantize's pass (its rows q8 are None)."""
    fast = getattr(eng, "attn_ops", None)
    got = None if fast is None else fast.qkv_heads(eng, A1, en1, P, dims, st.tracing)
    if got is None:
        qkv = []
        for j, t in enumerate("qkv"):
            q8, e8, Wq, ew = _affine_q8(eng, li, A1, en1, P[2 * j], P[2 * j + 1], st, f"{name}.{t}")
            st.tr((f"{name}.{t}.out_q", q8))
            qkv.append((q8, e8, Wq, ew))
        return qkv, [_heads_mm(eng, q8, *dims) for q8, _, _, _ in qkv]
    qkv, heads = [], []
    for t, (Mh, e8, Wq, ew, bacc, acc) in zip("qkv", got):
        _trace_affine(st, f"{name}.{t}", ew, bacc, acc)
        if st.tracing:
            st.tr((f"{name}.{t}.out_q", _rows(Mh, *dims).astype(np.int8)))
        qkv.append((None, e8, Wq, ew))
        heads.append(Mh)
    return qkv, heads


def _heads(M, n, b, T, H, dh):
    """Rows (n, b*T, D) -> (n*b*H, T, dh): column h*dh + i of row s*T + t is (s, h, t, i)."""
    return M.reshape(n, b, T, H, dh).transpose(0, 1, 3, 2, 4).reshape(n * b * H, T, dh)


def _heads_mm(eng, M, n, b, T, H, dh):
    """_heads(M), as float32 on the compiled route (its per-head GEMMs' operand)."""
    fast = getattr(eng, "attn_ops", None)
    return _heads(M, n, b, T, H, dh) if fast is None else fast.heads(M, n, b, T, H, dh)


def _rows(M, n, b, T, H, dh):
    """The inverse of _heads: (n*b*H, T, dh) -> (n, b*T, H*dh)."""
    return M.reshape(n, b, H, T, dh).transpose(0, 1, 3, 2, 4).reshape(n, b * T, H * dh)


def softmax_int(eng, Sc, E):
    """Causal integer softmax of scores Sc (n, ..., T, T) with exponent E (n,) (the 2**-a scale
    included): z = max(-128, floor((Sc - rowmax) * 2**(E + 4) + 1/2)), e = EXP[z + 128],
    S = sum e, P = min(127, floor((256 e + S) / (2 S))); P = 0 above the diagonal."""
    if getattr(eng, "attn_ops", None) is not None:
        return eng.attn_ops.softmax_int(eng, Sc, E)
    T = Sc.shape[-1]
    mask = np.tri(T, dtype=bool)
    m = np.where(mask, Sc, -np.inf).max(axis=-1, keepdims=True)
    z = np.floor((Sc - m) * N.per_mb(pow2(np.asarray(E) + 4), Sc.ndim) + 0.5)
    z = np.where(mask, np.maximum(z, -128.0), 0.0)
    e = np.where(mask, eng.exp_t[(z + 128.0).astype(np.intp)], 0).astype(np.int64)
    S = e.sum(axis=-1, keepdims=True)
    return np.minimum(127, N.idiv(256 * e + S, 2 * S)).astype(np.float64)


def softmax_back(P, dP, eng=None):
    """dA = P * (128 dP - rho), rho = sum_u P dP per row (exact integers < 2**49)."""
    if getattr(eng, "attn_ops", None) is not None:
        return eng.attn_ops.softmax_back(P, dP)
    Pi, dPi = P.astype(np.int64), dP.astype(np.int64)
    rho = (Pi * dPi).sum(axis=-1, keepdims=True)
    return (Pi * (128 * dPi - rho)).astype(np.float64)


_TORCH = []


def _torch():
    """The float twins (torch imported lazily): PosEmbed, RMSNorm, Block."""
    if _TORCH:
        return _TORCH[0]
    import types

    import torch

    class PosEmbed(torch.nn.Module):
        def __init__(self, T, D):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(T, D))

        def forward(self, x):  # (B, T, D)
            return x + self.weight[: x.shape[1]]

    class RMSNorm(torch.nn.Module):
        def forward(self, x):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-12)

    class Block(torch.nn.Module):
        def __init__(self, D, H, M):
            super().__init__()
            self.H, self.a = H, attn_shift(D // H)
            for t, (i, o) in zip(BLOCK_TENSORS, ((D, D), (D, D), (D, D), (D, D), (D, M), (M, D))):
                setattr(self, t, torch.nn.Linear(i, o))
            self.norm1, self.norm2 = RMSNorm(), RMSNorm()

        def forward(self, x):
            B, T, D = x.shape
            h = self.norm1(x)
            q, k, v = (getattr(self, t)(h).reshape(B, T, self.H, -1).transpose(1, 2) for t in "qkv")
            s = (q @ k.transpose(-1, -2)) * 2.0 ** -self.a
            s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf"))
            o = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, D)
            x = x + self.o(o)
            return x + self.fc2(torch.relu(self.fc1(self.norm2(x))))

    _TORCH.append(types.SimpleNamespace(PosEmbed=PosEmbed, RMSNorm=RMSNorm, Block=Block))
    return _TORCH[0]


KINDS = {k.type: k for k in (PosEmbed(), Block(), RMSNorm())}  #: in the registry (layers.py LAYERS)

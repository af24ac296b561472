"""The layer registry: one class per layer type, the one place that knows a type's spec
JSON, parameter shapes and init, the shape it maps its input to, forward and backward
through the units (the Engine's ``_mm``, ``_requantize`` and ``_relu``), unit counts, and
its torch float twin. Everything else (spec, engine, fast path, trainer, checkpoint,
export, floatref, golden, counters) asks ``kind_of(layer)``. The contract is written in
docs/ENGINE.md ("The layer registry"); the JS twin is ``webui/engine/layers.js``.

Shapes flowing between layers (validation): ``("flat", F)`` or ``("map", C, H, W)``.
Activations in the engine are (n, b, width) arrays, maps channel-major (c*H*W + y*W + x).
"""

from __future__ import annotations

import math
import re

import numpy as np

from daisychain.engine import conv as C
from daisychain.engine.detmath import pow2, quant_exponent, quantize
from daisychain.units.gemm import MAX_K
from daisychain.engine.attention import KINDS as ATTENTION_KINDS
from daisychain.engine.layer_base import (KERNELS, MAX_CONV_VALUES, MAX_FEATURES, Layer, LayerKind,  # noqa: F401
                                          SpecError, _affine, _int, _map, _per_mb, _requantize_out)

class Linear(LayerKind):
    type = "linear"
    op = "linear"
    params = 2
    paths = frozenset({"dense", "conv"})
    head = True

    def from_json(self, obj):
        return Layer("linear", _int(obj, "in"), _int(obj, "out"))

    def to_json(self, l):
        return {"type": "linear", "in": l.n_in, "out": l.n_out}

    def param_shapes(self, l):
        return [("weight", (l.n_out, l.n_in)), ("bias", (l.n_out,))]

    def init_bound(self, l):
        return 1.0 / np.sqrt(float(l.n_in))

    def out_shape(self, l, i, shape, layers):
        if shape[0] == "seq":  # a sequence model's output layer: applied to every position
            if l.n_in != shape[2]:
                raise SpecError(f"layer {i}: linear expects {l.n_in} inputs, gets {shape[2]} per position")
            if l.n_out > MAX_K:
                raise SpecError(f"layer {i}: out-features above {MAX_K} would overflow the error GEMM")
            return ("seq", shape[1], l.n_out)
        m = _map(shape)
        width = m[0] * m[1] * m[2] if m else shape[1]  # a map is read flattened, channel-major
        if l.n_in != width:
            raise SpecError(f"layer {i}: linear expects {l.n_in} inputs, gets {width}")
        if not 1 <= l.n_in <= MAX_FEATURES or l.n_out < 1:
            raise SpecError(f"layer {i}: linear in-features must lie in [1, {MAX_FEATURES}] "
                            f"so its int32 accumulator cannot overflow")
        if l.n_out > MAX_K:
            raise SpecError(f"layer {i}: out-features above {MAX_K} would overflow the error GEMM")
        return ("flat", l.n_out)

    def forward(self, eng, l, li, P, st):
        W, bias = P
        fast = getattr(eng, "attn_ops", None)
        if st.last and fast is not None:  # a sequence model's logits: the same values in one pass
            return (st.a, st.ex) + fast.logits(eng, li, st, W, bias)
        acc, sexp, Wq, ew = _affine(eng, li, st.a, st.ex, W, bias, st)
        cache = (st.a, st.ex, Wq, ew)
        if st.last:
            st.logits = acc * _per_mb(pow2(sexp), 3)
            st.tr(("logits", st.logits))
            return cache
        st.a = _requantize_out(eng, li, acc, sexp, st)
        st.tr((f"layers.{li}.out_q", st.a))
        return cache

    def backward(self, eng, l, li, pi, cache, bw):
        a_in, ex, Wq, ew = cache
        G = bw.int8(eng)
        eng._weight_grad(bw.out, pi, G, a_in, bw.eg + ex, bw.frac_bits, bw.limit)
        eng._accumulate(bw.out, pi + 1, G.sum(axis=1), bw.eg, bw.frac_bits, bw.limit)
        if li == 0:
            return
        fast = getattr(eng, "attn_ops", None)  # a sequence model's route: int32 from an exact int8 GEMM
        bw.G, bw.eg, bw.acc = (eng._mm(G, Wq) if fast is None else fast.mm(eng, G, Wq)), bw.eg + ew, True

    def describe(self, l, i, layers):
        last = max(j for j, x in enumerate(layers) if LAYERS[x.type].head)
        return None if i == last else str(l.n_out)  # a hidden width; the output layer is implicit

    def lower(self, l, li, layers):
        return self.op, dict(n_in=l.n_in, n_out=l.n_out, relu=folds_after(layers, li),
                             mask=folds_before(layers, li))

    def units(self, l, b, li, layers):
        mul = 2 * b * l.n_in * l.n_out  # forward + weight gradient
        rq = 0
        if li > 0:
            mul += b * l.n_in * l.n_out  # error into the layer below
            if not LAYERS[layers[li - 1].type].reads_tokens:
                rq += b * l.n_in  # requantized before the layer below uses it
        if li != len(layers) - 1:
            rq += b * l.n_out
        return mul, rq, 0

    def torch_module(self, l):
        import torch
        return torch.nn.Linear(l.n_in, l.n_out)


class Relu(LayerKind):
    type = "relu"
    paths = frozenset({"dense", "conv"})
    folds = True

    def out_shape(self, l, i, shape, layers):
        if i == 0 or layers[i - 1].type not in ("linear", "conv2d") or i == len(layers) - 1:
            raise SpecError(f"layer {i}: relu must follow a hidden linear or conv2d layer")
        return shape

    def forward(self, eng, l, li, P, st):
        st.a = eng._relu(st.a)
        st.tr((f"layers.{li}.out_q", st.a))
        return st.a

    def backward(self, eng, l, li, pi, relu_out, bw):
        bw.G = bw.G * (relu_out > 0)  # before the requantize when G is an accumulator

    def units(self, l, b, li, layers):
        return 0, 0, b * _width_before(layers, li)

    def torch_module(self, l):
        import torch
        return torch.nn.ReLU()


class Embedding(LayerKind):
    type = "embedding"
    params = 1
    reads_tokens = True

    def from_json(self, obj):
        return Layer("embedding", _int(obj, "vocab"), _int(obj, "dim"))

    def to_json(self, l):
        return {"type": "embedding", "vocab": l.n_in, "dim": l.n_out}

    def param_shapes(self, l):
        return [("weight", (l.n_in, l.n_out))]

    def out_shape(self, l, i, shape, layers):
        if i != 0 or shape[0] != "tokens":
            raise SpecError("an embedding must be the first layer of a 'tokens' model")
        if l.n_in < 1 or l.n_out < 1:
            raise SpecError("embedding vocab and dim must be >= 1")
        return ("flat", shape[1] * l.n_out)

    def forward(self, eng, l, li, P, st):
        (E,) = P
        x = st.a  # token ids (n, b, context)
        ee = int(quant_exponent(np.abs(E).max()))
        Eq = quantize(E, ee)
        if getattr(eng, "attn_ops", None) is not None:  # a sequence model's rows: int8 (the same values)
            Eq = Eq.astype(np.int8)
        st.a = Eq[x].reshape(x.shape[0], x.shape[1], -1)  # (n, b, C*D)
        st.ex = np.full(x.shape[0], ee, np.int64)
        st.tr((f"layers.{li}.weight_exponent", ee))
        st.tr((f"layers.{li}.out_q", st.a))
        return x

    def backward(self, eng, l, li, pi, tokens, bw):
        """Scatter-add the (unrequantized) input error rows into the table, integers."""
        n = tokens.shape[0]
        V, D = l.n_in, l.n_out
        dE = np.zeros((n, V, D), np.int64)
        flat = tokens.reshape(n, -1)
        fast = getattr(eng, "attn_ops", None)
        if fast is not None:  # the same integers, one compiled loop (engine/attnfast.py)
            fast.scatter_add(dE, flat, bw.G)
        else:
            dXi = bw.G.astype(np.int64).reshape(n, -1, D)
            for i in range(n):
                np.add.at(dE[i], flat[i], dXi[i])
        eng._accumulate(bw.out, pi, dE.astype(np.float64), bw.eg, bw.frac_bits, bw.limit)

    def torch_module(self, l):
        import torch
        return torch.nn.Embedding(l.n_in, l.n_out)


class Conv2d(LayerKind):
    """k x k, stride 1, zero 'same' padding: im2col, then the linear layer's arithmetic on
    the columns matrix (CONV_SPEC; docs/ENGINE.md)."""

    type = "conv2d"
    op = "conv"
    params = 2
    paths = frozenset({"conv"})
    item = re.compile(r"conv([0-9]+)(?:k([0-9]+))?")  # convN (3x3) or convNkK
    stack = "image"
    prefix = "conv"

    def check_item(self, t, m):
        if m.group(2) is not None and int(m.group(2)) not in KERNELS:
            raise SpecError(f"{t}: the kernel size must be 3 or 5")
        if not 1 <= int(m.group(1)) <= 4096:
            raise SpecError(f"{t}: a conv has 1 to 4096 filters")

    def item_layers(self, m, shape):
        _, c, h, w = shape
        co, k = int(m.group(1)), int(m.group(2) or 3)
        return [Layer("conv2d", c, co, k, h, w), Layer("relu")], ("map", co, h, w)

    def describe(self, l, i, layers):
        return f"conv{l.n_out}" + (f"k{l.kernel}" if l.kernel != 3 else "")

    def lower(self, l, li, layers):
        return self.op, dict(ci=l.n_in, co=l.n_out, k=l.kernel, h=l.height, w=l.width,
                             relu=folds_after(layers, li), mask=folds_before(layers, li))

    def from_json(self, obj):
        return Layer("conv2d", _int(obj, "in_channels"), _int(obj, "out_channels"),
                     _int(obj, "kernel"), _int(obj, "height"), _int(obj, "width"))

    def to_json(self, l):
        return {"type": "conv2d", "in_channels": l.n_in, "out_channels": l.n_out,
                "kernel": l.kernel, "height": l.height, "width": l.width}

    def param_shapes(self, l):
        return [("weight", (l.n_out, l.n_in, l.kernel, l.kernel)), ("bias", (l.n_out,))]

    def init_bound(self, l):
        return 1.0 / np.sqrt(float(l.n_in * l.kernel * l.kernel))

    def out_shape(self, l, i, shape, layers):
        m = _map(shape)
        if m is None:
            raise SpecError(f"layer {i}: conv2d needs an image-shaped input (an image or the "
                            f"output of a conv2d/maxpool2d), not a dense one: put every conv "
                            f"before the first dense layer")
        if (l.n_in, l.height, l.width) != m:
            raise SpecError(f"layer {i}: conv2d expects a {l.n_in}x{l.height}x{l.width} input, "
                            f"gets {m[0]}x{m[1]}x{m[2]}")
        if l.kernel not in KERNELS:
            raise SpecError(f"layer {i}: conv2d kernel must be one of {KERNELS}, not {l.kernel}")
        if l.n_out < 1:
            raise SpecError(f"layer {i}: conv2d needs at least one output channel")
        if l.n_in * l.kernel ** 2 > MAX_FEATURES:
            raise SpecError(f"layer {i}: conv2d in_channels * kernel^2 must be at most {MAX_FEATURES} "
                            f"so its int32 accumulator cannot overflow")
        if l.n_out * l.kernel ** 2 > MAX_K:
            raise SpecError(f"layer {i}: conv2d out_channels * kernel^2 above {MAX_K} would overflow "
                            f"the input error")
        hw = l.height * l.width
        if hw * l.n_in * l.kernel ** 2 > MAX_CONV_VALUES or hw * l.n_out > MAX_CONV_VALUES:
            raise SpecError(f"layer {i}: conv2d on a {l.height}x{l.width} map with {l.n_in} -> {l.n_out} "
                            f"channels needs more than {MAX_CONV_VALUES:,} values per sample; pool "
                            f"first or use fewer channels")
        return ("map", l.n_out, l.height, l.width)

    def forward(self, eng, l, li, P, st):
        W, bias = P
        n, b = st.a.shape[0], st.a.shape[1]
        HW = l.height * l.width
        cols = C.im2col(st.a, l.n_in, l.height, l.width, l.kernel)  # (n, b*H*W, Ci*k*k)
        acc, sexp, Wq, ew = _affine(eng, li, cols, st.ex, W.reshape(l.n_out, -1), bias, st)
        cache = (cols, st.ex, Wq, ew)
        out_q = _requantize_out(eng, li, acc, sexp, st)  # (n, b*H*W, Co)
        st.a = out_q.reshape(n, b, HW, l.n_out).transpose(0, 1, 3, 2).reshape(n, b, l.n_out * HW)
        st.tr((f"layers.{li}.out_q", st.a))
        return cache

    def backward(self, eng, l, li, pi, cache, bw):
        cols, ex, Wq, ew = cache
        G = bw.int8(eng)
        n, b = G.shape[0], G.shape[1]
        HW = l.height * l.width
        Gc = G.reshape(n, b, l.n_out, HW).transpose(0, 1, 3, 2).reshape(n, b * HW, l.n_out)
        eng._weight_grad(bw.out, pi, Gc, cols, bw.eg + ex, bw.frac_bits, bw.limit)
        eng._accumulate(bw.out, pi + 1, Gc.sum(axis=1), bw.eg, bw.frac_bits, bw.limit)
        if li == 0:
            return
        dcols = eng._mm(Gc, Wq)  # (n, b*H*W, Ci*k*k), exponent eg + ew
        bw.G = C.col2im(dcols, b, l.n_in, l.height, l.width, l.kernel)
        bw.eg, bw.acc = bw.eg + ew, True

    def units(self, l, b, li, layers):
        k2 = l.kernel * l.kernel
        per = b * l.height * l.width * l.n_in * k2 * l.n_out
        mul, rq = 2 * per, b * l.height * l.width * l.n_out
        if li > 0:
            mul += per
            rq += b * l.n_in * l.height * l.width
        return mul, rq, 0

    def torch_module(self, l):
        import torch
        return torch.nn.Conv2d(l.n_in, l.n_out, l.kernel, padding=(l.kernel - 1) // 2)


class MaxPool2d(LayerKind):
    """2x2, stride 2; an odd last row/column is dropped; ties go to the first position in
    the scan (0,0), (0,1), (1,0), (1,1)."""

    type = "maxpool2d"
    op = "pool"
    paths = frozenset({"conv"})
    item = re.compile("pool")
    stack = "image"

    def looks_like(self, t):
        return t == "pool"

    def item_layers(self, m, shape):
        _, c, h, w = shape
        return [Layer("maxpool2d", c, c, 0, h, w)], ("map", c, h // 2, w // 2)

    def describe(self, l, i, layers):
        return "pool"

    def lower(self, l, li, layers):
        return self.op, dict(c=l.n_in, h=l.height, w=l.width, mask=folds_before(layers, li))

    def from_json(self, obj):
        c = _int(obj, "channels")
        return Layer("maxpool2d", c, c, 0, _int(obj, "height"), _int(obj, "width"))

    def to_json(self, l):
        return {"type": "maxpool2d", "channels": l.n_in, "height": l.height, "width": l.width}

    def out_shape(self, l, i, shape, layers):
        m = _map(shape)
        if m is None:
            raise SpecError(f"layer {i}: maxpool2d needs an image-shaped input, not a dense one")
        if (l.n_in, l.height, l.width) != m:
            raise SpecError(f"layer {i}: maxpool2d expects a {l.n_in}x{l.height}x{l.width} input, "
                            f"gets {m[0]}x{m[1]}x{m[2]}")
        if l.height < 2 or l.width < 2:
            raise SpecError(f"layer {i}: maxpool2d on a {l.height}x{l.width} map: a 2x2 pool "
                            f"needs a map of at least 2x2 (too many pools for this image size)")
        return ("map", l.n_in, l.height // 2, l.width // 2)

    def forward(self, eng, l, li, P, st):
        st.a, arg = C.maxpool(st.a, l.n_in, l.height, l.width)
        st.tr((f"layers.{li}.out_q", st.a))
        return arg

    def backward(self, eng, l, li, pi, arg, bw):
        G = bw.int8(eng)
        if li == 0:
            return
        bw.G = C.maxpool_back(G, arg, l.n_in, l.height, l.width)  # int8, exponent unchanged

    def torch_module(self, l):
        import torch
        return torch.nn.MaxPool2d(2)


LAYERS: dict[str, LayerKind] = {**{k.type: k for k in (Linear(), Relu(), Embedding(), Conv2d(), MaxPool2d())},
                                 **ATTENTION_KINDS}  # posembed, block, rmsnorm (attention.py)


def kind_of(layer: Layer) -> LayerKind:
    try:
        return LAYERS[layer.type]
    except KeyError:
        raise SpecError(f"unknown layer type {layer.type!r}") from None


def layer_from_json(obj: dict) -> Layer:
    t = obj["type"]
    if t not in LAYERS:
        raise SpecError(f"unknown layer type {t!r}")
    return LAYERS[t].from_json(obj)


def _width_before(layers, li: int) -> int:
    """Width of the activation a relu at li reads: the output of the linear or conv before it."""
    l = layers[li - 1]
    return l.n_out * l.height * l.width if l.type == "conv2d" else l.n_out


def folds_after(layers, li: int) -> bool:
    """The layer after li is an activation that a compute path folds into it (a relu)."""
    return li + 1 < len(layers) and LAYERS[layers[li + 1].type].folds


def folds_before(layers, li: int) -> bool:
    """The layer before li is a folded activation (its error is masked by it)."""
    return li > 0 and LAYERS[layers[li - 1].type].folds


#: the kinds that have a --layers item (conv, pool, block; a dense width is an int)
ITEM_KINDS = tuple(k for k in LAYERS.values() if k.item is not None)


def item_kind(t: str):
    """(kind, match) of the --layers item ``t``, or (None, None) for no kind's item."""
    for k in ITEM_KINDS:
        m = k.item.fullmatch(t)
        if m is not None:
            return k, m
    return None, None


def item_stack(t: str) -> str:
    """The model family ("image", "transformer") that the text ``t`` means an item of, or ""."""
    return next((k.stack for k in ITEM_KINDS if k.looks_like(t)), "")


def is_sequence(layers) -> bool:
    """A sequence model: a kind in it makes every layer after it see b * context rows."""
    return any(LAYERS[l.type].sequence for l in layers)


def reads_exp(layers) -> bool:
    """Its forward reads the exp unit (an attention block's softmax)."""
    return any(LAYERS[l.type].exp_units(l, 1) for l in layers)


def param_count(layers) -> int:
    return sum(math.prod(s) for l in layers for _, s in kind_of(l).param_shapes(l))


def torch_sequential(spec):
    """The float twin of a spec as a ``torch.nn.Sequential``: one module per layer named by
    its index (so the state_dict names are the checkpoint's ``<i>.weight``), a
    ``Flatten`` (named ``flatten<i>``) before a linear whose input is a map or an
    embedding's rows, and for an image input an ``ImageInput`` (named ``input``) that
    reads uint8 pixels as the engine does: (x >> 1) * 2**-7, shaped (batch, C, H, W)."""
    from collections import OrderedDict

    import torch

    mods = OrderedDict()
    shaped = False  # the running activation is not (batch, features)
    seq = is_sequence(spec.layers)  # a sequence model: (batch, T, D) throughout
    if spec.input_kind == "image":
        mods["input"] = image_input(*spec.image)
        shaped = True
    for i, l in enumerate(spec.layers):
        if l.type == "linear" and shaped:
            mods[f"flatten{i}"] = torch.nn.Flatten(1)
            shaped = False
        mods[str(i)] = kind_of(l).torch_module(l)
        if l.type in ("embedding", "conv2d", "maxpool2d") and not seq:
            shaped = True
    return torch.nn.Sequential(mods)


_IMAGE_INPUT = []  #: the ImageInput class, made on first use (torch is imported lazily)


def image_input(c: int, h: int, w: int):
    """A torch module: uint8 pixels (batch, C*H*W) or (batch, C, H, W) -> float (batch, C,
    H, W) holding the engine's input value (pixel >> 1) * 2**-7."""
    if not _IMAGE_INPUT:
        import torch

        class ImageInput(torch.nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.shape = tuple(shape)
                # 2**-7, a non-persistent buffer: .double() / .to() set the output's dtype
                self.register_buffer("scale", torch.tensor(1.0 / 128.0), persistent=False)

            def forward(self, x):
                x = torch.floor(x.to(self.scale.dtype) * 0.5) * self.scale
                return x.reshape(x.shape[0], *self.shape)

        _IMAGE_INPUT.append(ImageInput)
    return _IMAGE_INPUT[0]((c, h, w))

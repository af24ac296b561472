"""What every layer kind shares (the registry is ``engine/layers.py``): the spec's
:class:`Layer`, the :class:`LayerKind` contract a kind implements, the flows of a forward
and backward pass through the units, the affine step (a GEMM, the bias and the rounding
shift) and the bounds that keep an int32 accumulator exact. The kinds' modules import this
one, not the registry, so that the registry can import them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daisychain.engine.detmath import exponent, pow2, quant_exponent, quantize

#: a linear's (or conv's) int32 accumulator holds K * 127 * 127 plus a bias clamped to 2**30
MAX_FEATURES = (2**31 - 1 - 2**30) // (127 * 127)
BIAS_LIMIT = 2.0**30  #: biases in accumulator units are clamped to ±2**30
KERNELS = (3, 5)  #: conv2d kernel sizes
#: most im2col values (H*W*Ci*k*k) or output values (Co*H*W) of one conv per sample: bounds
#: the memory a spec from elsewhere can make an engine allocate (8 MiB of int8 per sample)
MAX_CONV_VALUES = 2**23


class SpecError(ValueError):
    """A model spec or run setting that cannot be trained."""


@dataclass(frozen=True)
class Layer:
    type: str  #: a key of LAYERS
    n_in: int = 0  #: linear: in features; embedding: vocabulary; conv2d: in channels; maxpool2d: channels
    n_out: int = 0  #: linear: out features; embedding: vector size; conv2d: out channels; maxpool2d: channels
    kernel: int = 0  #: conv2d: k (k x k, stride 1, zero padding (k-1)/2)
    height: int = 0  #: conv2d / maxpool2d: input map height
    width: int = 0  #: conv2d / maxpool2d: input map width


def _map(shape) -> tuple[int, int, int] | None:
    return tuple(shape[1:]) if shape[0] == "map" else None


def _int(obj: dict, key: str) -> int:
    return int(obj[key])


class LayerKind:
    """One layer type. ``params`` = number of parameter tensors; ``paths``: the compiled
    compute paths (engine/paths.py: "dense", "conv") that run it besides the literal one.
    The facts below are what the rest of the engine asks a kind instead of its type string."""

    type = ""
    params = 0
    paths: frozenset = frozenset()
    #: an activation that a compute path folds into the layer before it (relu(requantize))
    folds = False
    #: may be the last layer: its dequantized outputs are the logits (a linear)
    head = False
    #: reads token ids, so it starts a 'tokens' model (an embedding)
    reads_tokens = False
    #: makes a sequence model: every layer after it sees b * context rows (a posembed)
    sequence = False
    #: the op a compiled path lowers it to (``lower``'s first item): "linear", "conv", "pool";
    #: "" for a kind that is folded or not lowered
    op = ""
    #: the --layers item of this kind (a regular expression, fullmatched), or None; ``stack``:
    #: the model family its items build ("image": conv/pool, "transformer": blocks)
    item = None
    stack = ""
    prefix = ""  #: what an item of it starts with (a --layers text is checked by it first)

    @property
    def dense_fast(self) -> bool:
        """The dense fast path (engine/fast.py) runs it."""
        return "dense" in self.paths

    # ---- --layers items (engine/spec.py layer_items, cnn, layers_text)
    def looks_like(self, t: str) -> bool:
        """The text ``t`` is meant as an item of this kind (then checked in full)."""
        return bool(self.prefix) and t.startswith(self.prefix)

    def check_item(self, t: str, m) -> None:
        """SpecError when the item ``t`` (its match ``m``) names a layer this kind cannot be."""

    def item_layers(self, m, shape: tuple) -> tuple[list[Layer], tuple]:
        """The layers an image model's item makes on the map ``shape``, and the shape after."""
        raise NotImplementedError

    def describe(self, l: Layer, i: int, layers) -> str | None:
        """Its --layers item (``conv32k5``, ``pool``, ``64``, ``block64h4``), or None when the
        item list names it implicitly (a relu, an embedding, the output layer)."""
        return None

    # ---- compute paths (engine/paths.py)
    def lower(self, l: Layer, li: int, layers) -> tuple[str, dict] | None:
        """This layer as one op of a compiled path's plan: (op, facts); None for a kind the
        plan folds into the layer before it. ``relu``: an activation folds into this op;
        ``mask``: the layer before folded one (its error is masked by it)."""
        return None

    def check_size(self, l: Layer, micro_batch: int) -> None:
        """SpecError when one micro-batch of this layer needs more than the engine holds."""

    # ---- spec
    def from_json(self, obj: dict) -> Layer:
        return Layer(self.type)

    def to_json(self, l: Layer) -> dict:
        return {"type": self.type}

    def param_shapes(self, l: Layer) -> list[tuple[str, tuple[int, ...]]]:
        """(suffix, shape) of each tensor, canonical order; names are layers.<i>.<suffix>."""
        return []

    def init_bound(self, l: Layer) -> float:
        return 1.0

    def init_bounds(self, l: Layer) -> list[float]:
        """The uniform bound of each parameter tensor (a block's differ: fc2's fan-in is M)."""
        return [self.init_bound(l)] * self.params

    def out_shape(self, l: Layer, i: int, shape: tuple, layers) -> tuple:
        """The shape after this layer, given the shape before it; SpecError if it cannot apply."""
        return shape

    # ---- engine (reference path): see docs/ENGINE.md for the arithmetic
    def forward(self, eng, l: Layer, li: int, P: list, st: "Flow") -> object:
        raise NotImplementedError

    def backward(self, eng, l: Layer, li: int, pi: int, cache, bw: "Back") -> None:
        raise NotImplementedError

    def units(self, l: Layer, b: int, li: int, layers) -> tuple[int, int, int]:
        """(multiply, requantize, relu) unit invocations for one micro-batch of b samples
        (b rows: a sequence model's layers after its posembed get b * context)."""
        return 0, 0, 0

    def exp_units(self, l: Layer, b: int) -> int:
        """exp unit reads for one micro-batch of b samples (the transformer block's softmax)."""
        return 0

    # ---- torch float twin
    def torch_module(self, l: Layer):
        """The torch module of this layer (its parameters have the engine's shapes)."""
        raise NotImplementedError


@dataclass
class Flow:
    """The forward pass's running state: the activation ``a`` (n, b, width) with its
    per-micro-batch exponent ``ex`` (n,), the logits once the last layer ran, the trace."""

    a: np.ndarray
    ex: np.ndarray
    tr: object
    last: bool = False
    logits: np.ndarray | None = None
    tracing: bool = False  #: ``tr`` keeps what it is given (a compiled route skips values otherwise unused)


@dataclass
class Back:
    """The backward pass's running state: errors ``G`` (n, b, width) with exponent ``eg``;
    ``acc`` when G is still an accumulator (not yet requantized: a ReLU may mask it first);
    the fixed-point gradient ``out`` and its settings; ``keys``: a sequence model's sample
    keys (n, b) (engine/sround.py: its errors round stochastically), else None."""

    G: np.ndarray
    eg: np.ndarray
    acc: bool
    out: np.ndarray
    frac_bits: int
    limit: float
    keys: np.ndarray | None = None

    def int8(self, eng) -> np.ndarray:
        """G as int8 errors: an accumulator is requantized with s = max(0, bitlen(max|G|) - 7)
        per micro-batch, and eg grows by s."""
        if self.acc:
            s = np.maximum(exponent(_absmax(self.G)) - 7, 0)
            self.G = eng._requantize(self.G, s)
            self.eg = self.eg + s
            self.acc = False
        return self.G


def _per_mb(e, ndim: int) -> np.ndarray:
    return np.asarray(e).reshape((-1,) + (1,) * (ndim - 1))


def _absmax(x: np.ndarray) -> np.ndarray:
    return np.abs(x).reshape(x.shape[0], -1).max(axis=1)


def _affine(eng, li: int, a: np.ndarray, ex: np.ndarray, W2: np.ndarray, bias: np.ndarray, st: Flow,
            name: str | None = None):
    """The linear layer's forward on rows a (n, rows, K): returns (acc, sexp, Wq, ew) with
    acc = unitGEMM(a, Wq^T) + bacc (n, rows, out) and the trace entries written (under
    ``name``, default ``layers.<li>``: a block's sub-layers have their own)."""
    return _affine_am(eng, li, a, ex, W2, bias, st, name)[:4]


def _affine_am(eng, li, a, ex, W2, bias, st, name=None):
    """_affine, and max|acc| per micro-batch where the engine's compiled sequence route
    (engine/attnfast.py, the same values) took it on the way; else None."""
    name = name or f"layers.{li}"
    fast = getattr(eng, "attn_ops", None)
    if fast is not None:
        acc, sexp, Wq, ew, bacc, am = fast.affine(eng, a, ex, W2, bias)
    else:
        ew = int(quant_exponent(np.abs(W2).max()))
        Wq = quantize(W2, ew)
        acc = eng._mm(a, Wq.T)
        sexp = ex + ew
        bacc = np.clip(np.floor(bias[None, :] * pow2(-sexp)[:, None] + 0.5), -BIAS_LIMIT, BIAS_LIMIT)
        acc, am = acc + bacc[:, None, :], None
    _trace_affine(st, name, ew, bacc, acc)
    return acc, sexp, Wq, ew, am


def _trace_affine(st, name, ew, bacc, acc):
    st.tr((f"{name}.weight_exponent", ew))
    st.tr((f"{name}.bias_acc", bacc))
    st.tr((f"{name}.acc", acc))


def _requantize_out(eng, li: int, acc: np.ndarray, sexp: np.ndarray, st: Flow) -> np.ndarray:
    s = np.maximum(exponent(_absmax(acc)) - 7, 0)  # bit length - 7, per micro-batch
    st.tr((f"layers.{li}.shift", s))
    st.ex = sexp + s
    return eng._requantize(acc, s)

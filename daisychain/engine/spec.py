"""Model specs and run settings: small declarative descriptions, serialisable to JSON so that
a browser builds the identical model.

A model is a list of layers applied in order; each layer type is a class of the registry
(``engine/layers.py``), which validates it. ``embedding`` may only come first (it maps a
window of token ids to the concatenation of their vectors); every ``linear`` or ``conv2d``
that is not the last layer is followed by the requantize unit (and ``relu`` if the next
layer is one); ``conv2d`` and ``maxpool2d`` need a map (an image input or a conv/pool
before them); the last layer is a ``linear`` whose output, dequantized, is the logits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from daisychain.engine.layers import (KERNELS, MAX_FEATURES, Layer, SpecError, is_sequence,  # noqa: F401
                                      item_kind, item_stack, kind_of, layer_from_json, param_count, reads_exp)

MAX_PARAMS = 50_000_000
#: a peer's capacity (micro-batches per second) lies in [MIN_CAPACITY, MAX_CAPACITY]: the
#: ``--capacity`` flag and a ``ready`` message from another peer are held to the same range
MIN_CAPACITY = 1e-3
MAX_CAPACITY = 1e9
#: a run's learning rate lies in (0, MAX_LR] and its weight decay in [0, MAX_WEIGHT_DECAY]:
#: beyond them the parameters leave the range the INT8 quantization and float64 Adam hold
#: (an infinite or huge lr makes them NaN); a run has 1 to MAX_STEPS steps
MAX_LR = 1.0
MAX_WEIGHT_DECAY = 1.0
MAX_STEPS = 10_000_000
#: local steps (daisychain/engine/local.py): a run has 1 to MAX_REPLICAS replicas, each
#: taking 1 to MAX_SYNC_EVERY inner steps a round; the outer step's rate lies in
#: (0, MAX_OUTER_LR] and its momentum in [0, 1)
MAX_REPLICAS = 1024
MAX_SYNC_EVERY = 100_000
MAX_OUTER_LR = 4.0
#: K: a local-steps run's inner moments cross the wire every K rounds (an anchor,
#: engine/local.py); the default is left out of the identity JSON
MOMENTS_EVERY = 8
MAX_MOMENTS_EVERY = 1024
INPUT_KINDS = ("dense", "tokens", "image")
#: the registry's losses: cross-entropy over the classes (softmax), or mean squared error of
#: the outputs against float targets (regression; docs/ENGINE.md, "Losses")
LOSSES = ("cross_entropy", "mse")
MAX_IMAGE_SIDE = 1024  #: largest image height or width
MAX_CHANNELS = 64  #: most image channels


@dataclass(frozen=True)
class ModelSpec:
    layers: tuple[Layer, ...]
    input_kind: str  #: "dense" (float features) | "tokens" (int ids, embedding first) | "image"
    input_dim: int  #: dense: number of features; tokens: context length; image: C*H*W
    classes: int
    image: tuple[int, int, int] | None = None  #: image: (channels, height, width)
    #: one of LOSSES; "mse": ``classes`` is the number of outputs. Cross-entropy is left out of
    #: the JSON, so every run without a loss of its own keeps its identity
    loss: str = "cross_entropy"

    def to_json(self) -> dict:
        inp = {"kind": self.input_kind, "dim": self.input_dim}
        if self.input_kind == "image":
            inp.update(zip(("channels", "height", "width"), self.image))
        out = {"input": inp, "classes": self.classes, "layers": [kind_of(l).to_json(l) for l in self.layers]}
        if self.loss != "cross_entropy":
            out["loss"] = self.loss
        return out

    @staticmethod
    def from_json(obj: dict) -> "ModelSpec":
        try:
            layers = tuple(layer_from_json(l) for l in obj["layers"])
            inp = obj["input"]
            kind = str(inp["kind"])
            image = None
            if kind == "image":
                image = tuple(int(inp[k]) for k in ("channels", "height", "width"))
            spec = ModelSpec(layers, kind, int(inp["dim"]), int(obj["classes"]), image,
                             str(obj.get("loss", "cross_entropy")))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SpecError):
                raise
            raise SpecError(f"malformed model spec: {exc!r}") from None
        spec.validate()
        return spec

    @property
    def seq(self) -> bool:
        """A sequence model (a transformer: it has a posembed): logits at every position,
        every position carries the loss (docs/ENGINE.md, "The transformer")."""
        return is_sequence(self.layers)

    @property
    def uses_exp(self) -> bool:
        """Its forward reads the exp unit (an attention block)."""
        return reads_exp(self.layers)

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Canonical parameter order: by layer, weight then bias (torch state_dict names)."""
        return [(f"layers.{i}.{suffix}", shape) for i, l in enumerate(self.layers)
                for suffix, shape in kind_of(l).param_shapes(l)]

    def validate(self) -> None:
        if not self.layers:
            raise SpecError("a model needs at least one layer")
        if self.loss not in LOSSES:
            raise SpecError(f"the loss must be one of {', '.join(LOSSES)}, not {self.loss!r}")
        if self.input_kind not in INPUT_KINDS:
            raise SpecError(f"input kind must be one of {', '.join(INPUT_KINDS)}, got {self.input_kind!r}")
        if self.input_kind == "image":
            if self.image is None or len(self.image) != 3:
                raise SpecError("an image input needs channels, height and width")
            c, h, w = self.image
            if not (1 <= c <= MAX_CHANNELS and 1 <= h <= MAX_IMAGE_SIDE and 1 <= w <= MAX_IMAGE_SIDE):
                raise SpecError(f"an image is 1..{MAX_CHANNELS} channels of 1..{MAX_IMAGE_SIDE} x "
                                f"1..{MAX_IMAGE_SIDE} pixels, not {c}x{h}x{w}")
            if self.input_dim != c * h * w:
                raise SpecError(f"image input dim {self.input_dim} is not {c}*{h}*{w}")
            shape = ("map", c, h, w)
        elif self.image is not None:
            raise SpecError("only an image input has channels, height and width")
        else:
            shape = ("tokens" if self.input_kind == "tokens" else "flat", self.input_dim)
        for i, l in enumerate(self.layers):
            shape = kind_of(l).out_shape(l, i, shape, self.layers)
        if self.input_kind == "tokens" and not kind_of(self.layers[0]).reads_tokens:
            raise SpecError("a 'tokens' model must start with an embedding")
        if not kind_of(self.layers[-1]).head or self.layers[-1].n_out != self.classes:
            raise SpecError(f"the last layer must be linear(.., {self.classes})")
        n = param_count(self.layers)
        if n > MAX_PARAMS:
            raise SpecError(f"{n} parameters is more than this engine trains ({MAX_PARAMS})")


MAX_HIDDEN_LAYERS = 16  #: most hidden layers a --layers setting may name


def hidden_widths(hidden: int | Sequence[int], depth: int = 1) -> tuple[int, ...]:
    """``128`` -> ``(128,)`` (``depth`` times); ``[256, 256]`` -> ``(256, 256)``."""
    if isinstance(hidden, (int, np.integer)) and not isinstance(hidden, bool):
        widths = (int(hidden),) * depth
    else:
        widths = tuple(hidden)
        if not all(isinstance(w, (int, np.integer)) and not isinstance(w, bool) for w in widths):
            raise SpecError(f"hidden widths must be integers, got {list(widths)!r}")
        widths = tuple(int(w) for w in widths)
    if not 1 <= len(widths) <= MAX_HIDDEN_LAYERS:
        raise SpecError(f"a model has 1 to {MAX_HIDDEN_LAYERS} hidden layers, not {len(widths)}")
    if any(w < 1 for w in widths):
        raise SpecError(f"hidden widths must be >= 1, got {','.join(map(str, widths))}")
    return widths


def _stack(width: int, widths: tuple[int, ...], classes: int) -> list[Layer]:
    layers: list[Layer] = []
    for w in widths:
        layers += [Layer("linear", width, w), Layer("relu")]
        width = w
    layers.append(Layer("linear", width, classes))
    return layers


def mlp(n_in: int, hidden: int | Sequence[int], classes: int, depth: int = 1) -> ModelSpec:
    """Dense MLP: ``hidden`` is one width (repeated ``depth`` times) or the list of widths."""
    spec = ModelSpec(tuple(_stack(n_in, hidden_widths(hidden, depth), classes)), "dense", n_in, classes)
    spec.validate()
    return spec


def char_mlp(vocab: int, context: int, dim: int, hidden: int | Sequence[int]) -> ModelSpec:
    """Char model: an embedding, then the same hidden stack as ``mlp``, then the vocab logits."""
    layers = [Layer("embedding", vocab, dim), *_stack(context * dim, hidden_widths(hidden), vocab)]
    spec = ModelSpec(tuple(layers), "tokens", context, vocab)
    spec.validate()
    return spec


def hidden_of(spec: ModelSpec) -> list[int]:
    """The hidden widths of a spec (the out-features of every linear but the last)."""
    return [l.n_out for l in spec.layers if kind_of(l).head][:-1]


# ------------------------------------------------------------------ convolutional models
#: the default CNN of an image task: its parameters sit in the convolutions, not in a
#: dense head (28x28x1: ~29k parameters, 576 -> classes at the end)
DEFAULT_CNN = ("conv16", "pool", "conv32", "pool", "conv64", "pool")
MAX_LAYER_ITEMS = 32  #: most items a --layers setting may name
MAX_BLOCKS = 16  #: most transformer blocks a --layers setting may name


def layer_items(items) -> tuple[int | str, ...]:
    """Check a --layers list: dense widths (ints) and ``convN``, ``convNkK``, ``pool``."""
    items = tuple(items)
    if not 1 <= len(items) <= MAX_LAYER_ITEMS:
        raise SpecError(f"--layers names 1 to {MAX_LAYER_ITEMS} layers, not {len(items)}")
    out = []
    for t in items:
        if isinstance(t, (int, np.integer)) and not isinstance(t, bool):
            out.append(int(t))
            continue
        kind, m = item_kind(str(t))  # the kind whose item it is checks it (engine/layers.py)
        if kind is None:
            raise SpecError(f"unknown --layers item {t!r}: use a width (128), convN (3x3), "
                            f"convNkK (KxK, K in 3 or 5), pool, or blockWhH (a transformer block)")
        kind.check_item(str(t), m)
        out.append(str(t))
    blocks = [t for t in out if isinstance(t, str) and item_stack(t) == "transformer"]
    if blocks and len(blocks) != len(out):
        raise SpecError("--layers: a transformer is blockWhH items only (e.g. block64h4,block64h4)")
    if len(blocks) > MAX_BLOCKS:
        raise SpecError(f"at most {MAX_BLOCKS} transformer blocks, not {len(blocks)}")
    dense = [w for w in out if isinstance(w, int)]
    if len(dense) > MAX_HIDDEN_LAYERS:
        raise SpecError(f"at most {MAX_HIDDEN_LAYERS} hidden layers, not {len(dense)}")
    if any(w < 1 for w in dense):
        raise SpecError(f"hidden widths must be >= 1, got {','.join(map(str, dense))}")
    return tuple(out)


def cnn(image: tuple[int, int, int], items, classes: int) -> ModelSpec:
    """An image model from --layers items: each ``convN``/``convNkK`` is conv2d + relu,
    ``pool`` a 2x2 max pool, each width a dense hidden layer + relu (the map is flattened,
    channel-major, before the first one), then linear(.., classes)."""
    items = layer_items(items)
    c, h, w = image
    shape: tuple = ("map", c, h, w)
    layers: list[Layer] = []
    for t in items:
        if isinstance(t, int):
            width = shape[1] * shape[2] * shape[3] if shape[0] == "map" else shape[1]
            layers += [Layer("linear", width, t), Layer("relu")]
            shape = ("flat", t)
            continue
        if shape[0] != "map":
            raise SpecError(f"--layers: {t} comes after a dense layer; every conv and pool must "
                            f"come before the first dense width")
        kind, m = item_kind(t)
        made, shape = kind.item_layers(m, shape)
        layers += made
    width = shape[1] * shape[2] * shape[3] if shape[0] == "map" else shape[1]
    layers.append(Layer("linear", width, classes))
    spec = ModelSpec(tuple(layers), "image", image[0] * image[1] * image[2], classes, tuple(image))
    spec.validate()
    return spec


def is_transformer(items) -> bool:
    """True when --layers items name transformer blocks (``blockWhH``)."""
    return not isinstance(items, (int, np.integer)) and items is not None and any(
        isinstance(t, str) and item_stack(t) == "transformer" for t in items)


def gpt(vocab: int, context: int, items) -> ModelSpec:
    """A transformer from --layers ``blockWhH`` items: embedding(V, W), posembed(T, W), the
    blocks (MLP 4W), rmsnorm(W), linear(W, V) applied at every position."""
    items = layer_items(items)
    dims = [tuple(int(g) for g in item_kind(t)[1].groups()) for t in items]
    W = dims[0][0]
    if any(w != W for w, _ in dims):
        raise SpecError(f"every block of a transformer has one width (the residual stream's), "
                        f"not {','.join(str(w) for w, _ in dims)}")
    layers = [Layer("embedding", vocab, W), Layer("posembed", context, W)]
    layers += [Layer("block", W, W, h, context, 4 * W) for _, h in dims]
    layers += [Layer("rmsnorm", W, W, 0, context), Layer("linear", W, vocab)]
    spec = ModelSpec(tuple(layers), "tokens", context, vocab)
    spec.validate()
    return spec


def layers_text(spec: ModelSpec) -> str:
    """The --layers text that makes this spec (conv, pool and hidden widths, in order)."""
    items = (kind_of(l).describe(l, i, spec.layers) for i, l in enumerate(spec.layers))
    return ",".join(t for t in items if t is not None)


@dataclass(frozen=True)
class Hyper:
    """Everything besides the model and data that fixes a run's arithmetic."""

    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    batch: int = 64  #: global batch (samples per step)
    micro_batch: int = 16  #: samples per micro-batch; batch must be a multiple
    grad_frac_bits: int = 40  #: S: gradients cross the wire as floor(g * 2**S + 1/2)
    seed: int = 0
    #: the image recipe (daisychain/engine/augment.py); 0 = off, and then left out of the
    #: JSON, so that a run without them keeps its identity
    augment_shift: int = 0  #: image task: random shifts of up to this many pixels
    lr_warmup: int = 0  #: linear learning-rate warm-up over this many steps
    lr_decay_steps: int = 0  #: linear learning-rate decay to 0 at this step
    #: local steps (daisychain/engine/local.py): R replicas, H inner steps a round, the outer
    #: Nesterov step's rate and momentum; R == H == 1 is the synchronous run, and then all
    #: four are left out of the JSON (its identity is the one it always had)
    replicas: int = 1
    sync_every: int = 1
    outer_lr: float = 1.0
    outer_momentum: float = 0.5
    moments_every: int = MOMENTS_EVERY  #: K (the bits do not depend on it, the wire does)

    def __post_init__(self):
        # floats are floats (a JSON 0 from a peer must not change the run id), ints are ints
        for name in ("lr", "beta1", "beta2", "eps", "weight_decay", *OUTER_FLOATS):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise SpecError(f"{name} must be a number, got {v!r}")
            object.__setattr__(self, name, float(v))
        for name in ("batch", "micro_batch", "grad_frac_bits", "seed", *RECIPE_FIELDS, "replicas",
                     "sync_every", "moments_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise SpecError(f"{name} must be an integer, got {v!r}")
            object.__setattr__(self, name, int(v))

    @property
    def n_micro(self) -> int:
        return self.batch // self.micro_batch

    @property
    def local(self) -> bool:
        """True for a local-steps run (more than one replica or inner step a round)."""
        return self.replicas != 1 or self.sync_every != 1

    def validate(self) -> None:
        if self.micro_batch < 1 or self.batch < 1 or self.batch % self.micro_batch:
            raise SpecError(f"--batch ({self.batch}) must be a positive multiple of "
                            f"--micro-batch ({self.micro_batch})")
        if self.micro_batch > 4096:
            raise SpecError("--micro-batch above 4096 is not supported")
        # the same checks and words as webui/engine/spec.js makeHyper (a run a host sends)
        if not 0 < self.lr <= MAX_LR:  # also refuses nan
            raise SpecError(f"--lr must be a finite number in (0, {MAX_LR:g}]")
        if not 0 <= self.weight_decay <= MAX_WEIGHT_DECAY:
            raise SpecError(f"--weight-decay must be a finite number in [0, {MAX_WEIGHT_DECAY:g}]")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and 0 < self.eps <= 1):
            raise SpecError("betas must lie in [0, 1) and eps in (0, 1]")
        if not 0 <= self.seed <= 0xFFFFFFFF:
            raise SpecError("--seed must be an integer in [0, 2**32 - 1]")
        if not 0 <= self.grad_frac_bits <= 60:
            raise SpecError("grad_frac_bits must lie in [0, 60]")
        if not 0 <= self.augment_shift <= 8:
            raise SpecError("--augment-shift must lie in [0, 8] pixels")
        if not (0 <= self.lr_warmup <= 2**31 and 0 <= self.lr_decay_steps <= 2**31):
            raise SpecError("--lr-warmup and --lr-decay-steps must lie in [0, 2**31]")
        if self.lr_decay_steps and self.lr_warmup >= self.lr_decay_steps:
            raise SpecError(f"--lr-warmup ({self.lr_warmup}) must be below --lr-decay-steps "
                            f"({self.lr_decay_steps})")
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise SpecError(f"--replicas must lie in [1, {MAX_REPLICAS}]")
        if not 1 <= self.sync_every <= MAX_SYNC_EVERY:
            raise SpecError(f"--sync-every must lie in [1, {MAX_SYNC_EVERY}]")
        if not 0 < self.outer_lr <= MAX_OUTER_LR:
            raise SpecError(f"--outer-lr must be a finite number in (0, {MAX_OUTER_LR:g}]")
        if not 0 <= self.outer_momentum < 1:
            raise SpecError("--outer-momentum must be a finite number in [0, 1)")
        if not 1 <= self.moments_every <= MAX_MOMENTS_EVERY:
            raise SpecError(f"--moments-every must lie in [1, {MAX_MOMENTS_EVERY}]")

    def to_json(self) -> dict:
        out = asdict(self)
        for name in RECIPE_FIELDS:
            if not out[name]:
                del out[name]
        if not self.local:
            for name in LOCAL_FIELDS:
                del out[name]
        if not self.local or self.moments_every == MOMENTS_EVERY:
            del out["moments_every"]  # the default K keeps the run id it had before K existed
        return out


RECIPE_FIELDS = ("augment_shift", "lr_warmup", "lr_decay_steps")
#: the local-steps fields, all in the JSON of a local-steps run, none in a synchronous one's
LOCAL_FIELDS = ("replicas", "sync_every", "outer_lr", "outer_momentum")
OUTER_FLOATS = ("outer_lr", "outer_momentum")


def dumps_canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))

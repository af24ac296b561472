"""Model specs and run settings: small declarative descriptions, serialisable to JSON so that
a browser builds the identical model.

A model is a list of layers applied in order. ``embedding`` may only come first (it maps a
window of token ids to the concatenation of their vectors); every ``linear`` that is not
the last layer is followed by the requantize unit (and ``relu`` if the next layer is one);
the last layer is a ``linear`` whose output, dequantized, is the logits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from daisychain.units.gemm import MAX_K

#: a linear's int32 accumulator holds K * 127 * 127 plus a bias clamped to 2**30
MAX_FEATURES = (2**31 - 1 - 2**30) // (127 * 127)
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


class SpecError(ValueError):
    """A model spec or run setting that cannot be trained."""


@dataclass(frozen=True)
class Layer:
    type: str  #: "linear" | "relu" | "embedding"
    n_in: int = 0  #: linear: in features; embedding: vocabulary size
    n_out: int = 0  #: linear: out features; embedding: vector size

    def to_json(self) -> dict:
        if self.type == "linear":
            return {"type": "linear", "in": self.n_in, "out": self.n_out}
        if self.type == "embedding":
            return {"type": "embedding", "vocab": self.n_in, "dim": self.n_out}
        return {"type": "relu"}


@dataclass(frozen=True)
class ModelSpec:
    layers: tuple[Layer, ...]
    input_kind: str  #: "dense" (float features) | "tokens" (int ids, embedding first)
    input_dim: int  #: dense: number of features; tokens: context length
    classes: int

    def to_json(self) -> dict:
        return {"input": {"kind": self.input_kind, "dim": self.input_dim},
                "classes": self.classes, "layers": [l.to_json() for l in self.layers]}

    @staticmethod
    def from_json(obj: dict) -> "ModelSpec":
        try:
            layers = []
            for l in obj["layers"]:
                t = l["type"]
                if t == "linear":
                    layers.append(Layer("linear", int(l["in"]), int(l["out"])))
                elif t == "embedding":
                    layers.append(Layer("embedding", int(l["vocab"]), int(l["dim"])))
                elif t == "relu":
                    layers.append(Layer("relu"))
                else:
                    raise SpecError(f"unknown layer type {t!r}")
            spec = ModelSpec(tuple(layers), str(obj["input"]["kind"]), int(obj["input"]["dim"]),
                             int(obj["classes"]))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SpecError):
                raise
            raise SpecError(f"malformed model spec: {exc!r}") from None
        spec.validate()
        return spec

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Canonical parameter order: by layer, weight then bias (torch state_dict names)."""
        out = []
        for i, l in enumerate(self.layers):
            if l.type == "linear":
                out += [(f"layers.{i}.weight", (l.n_out, l.n_in)), (f"layers.{i}.bias", (l.n_out,))]
            elif l.type == "embedding":
                out.append((f"layers.{i}.weight", (l.n_in, l.n_out)))
        return out

    def validate(self) -> None:
        if not self.layers:
            raise SpecError("a model needs at least one layer")
        if self.input_kind not in ("dense", "tokens"):
            raise SpecError(f"input kind must be 'dense' or 'tokens', got {self.input_kind!r}")
        width = self.input_dim
        for i, l in enumerate(self.layers):
            if l.type == "embedding":
                if i != 0 or self.input_kind != "tokens":
                    raise SpecError("an embedding must be the first layer of a 'tokens' model")
                if l.n_in < 1 or l.n_out < 1:
                    raise SpecError("embedding vocab and dim must be >= 1")
                width = self.input_dim * l.n_out
            elif l.type == "linear":
                if l.n_in != width:
                    raise SpecError(f"layer {i}: linear expects {l.n_in} inputs, gets {width}")
                if not 1 <= l.n_in <= MAX_FEATURES or l.n_out < 1:
                    raise SpecError(f"layer {i}: linear in-features must lie in [1, {MAX_FEATURES}] "
                                    f"so its int32 accumulator cannot overflow")
                if l.n_out > MAX_K:
                    raise SpecError(f"layer {i}: out-features above {MAX_K} would overflow the error GEMM")
                width = l.n_out
            elif l.type == "relu":
                if i == 0 or self.layers[i - 1].type != "linear" or i == len(self.layers) - 1:
                    raise SpecError(f"layer {i}: relu must follow a hidden linear layer")
            else:
                raise SpecError(f"layer {i}: unknown type {l.type!r}")
        if self.input_kind == "tokens" and self.layers[0].type != "embedding":
            raise SpecError("a 'tokens' model must start with an embedding")
        if self.layers[-1].type != "linear" or self.layers[-1].n_out != self.classes:
            raise SpecError(f"the last layer must be linear(.., {self.classes})")
        n = sum(int(__import__("math").prod(s)) for _, s in self.param_shapes())
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
    return [l.n_out for l in spec.layers if l.type == "linear"][:-1]


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

    def __post_init__(self):
        # floats are floats (a JSON 0 from a peer must not change the run id), ints are ints
        for name in ("lr", "beta1", "beta2", "eps", "weight_decay"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise SpecError(f"{name} must be a number, got {v!r}")
            object.__setattr__(self, name, float(v))
        for name in ("batch", "micro_batch", "grad_frac_bits", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise SpecError(f"{name} must be an integer, got {v!r}")
            object.__setattr__(self, name, int(v))

    @property
    def n_micro(self) -> int:
        return self.batch // self.micro_batch

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

    def to_json(self) -> dict:
        return asdict(self)


def dumps_canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))

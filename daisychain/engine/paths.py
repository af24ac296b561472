"""The path registry: which compute path runs a model's forward and backward. Every path
gives the same bits as the literal one (``engine/model.py``, layer by layer through the
registry, every requantize and ReLU read from its table); a path is chosen by asking each,
in order, whether it ``accepts(spec)``, never by the model's layer types.

The compiled paths compute requantize and ReLU by arithmetic, so they are offered only on
the "fast" GEMM route with tables equal to their definitions (``exact``); otherwise the
literal path runs. A whole path (dense, conv) runs a whole step and may hand a call back
(``None``: the literal path takes it); the transformer's attnfast is rules that the
literal path's attention kinds read (``Engine.attn_ops``).

One file per path: ``fast.py`` (dense), ``convfast.py`` (image), ``attnfast.py`` (the
transformer's rules); their shared compiled kernels are ``kernels.py``.
"""

from __future__ import annotations

from daisychain.engine.layers import kind_of


class Path:
    """A compute path. ``attr``: the Engine attribute it is opened into (None: none);
    ``whole``: it runs a whole forward/grad (else its object is rules the kinds read)."""

    name = ""
    attr: str | None = None
    whole = False

    def accepts(self, spec) -> bool:
        raise NotImplementedError

    def open(self, spec, layout):
        """The path's object for this spec (numba and torch load lazily here)."""
        return None


def _all_on(spec, path: str) -> bool:
    """Every layer's kind says that ``path`` runs it."""
    return all(path in kind_of(l).paths for l in spec.layers)


class DenseFast(Path):
    """Dense models (linear and relu on float features): engine/fast.py."""

    name, attr, whole = "dense", "fast", True

    def accepts(self, spec):
        return spec.input_kind == "dense" and _all_on(spec, "dense")

    def open(self, spec, layout):
        from daisychain.engine.fast import FastPath
        return FastPath(spec, layout)


class ConvFast(Path):
    """Image models with the cross-entropy loss (conv2d, maxpool2d, linear, relu):
    engine/convfast.py; it hands a call back where numba is missing."""

    name, attr, whole = "conv", "conv_fast", True

    def accepts(self, spec):
        return spec.input_kind == "image" and spec.loss != "mse" and _all_on(spec, "conv")

    def open(self, spec, layout):
        from daisychain.engine.convfast import ConvFastPath
        return ConvFastPath(spec, layout)


class AttnFast(Path):
    """Sequence models (a transformer): the literal path with the block's per-row rules
    compiled (engine/attnfast.py; None without numba: the numpy rules of norm.py)."""

    name, attr = "attnfast", "attn_ops"

    def accepts(self, spec):
        return spec.seq

    def open(self, spec, layout):
        from daisychain.engine.attnfast import attn_ops
        return attn_ops()


class Literal(Path):
    """Layer by layer through the registry: any model."""

    name = "literal"

    def accepts(self, spec):
        return True


LITERAL = Literal()
#: asked in order; the literal path accepts every spec, so one always does
PATHS: tuple[Path, ...] = (DenseFast(), ConvFast(), AttnFast(), LITERAL)


def choose(spec, exact: bool) -> Path:
    """The path for ``spec``: the first that accepts it, or the literal path where the
    tables are not their definitions (or the GEMM route reads every product from them)."""
    if not exact:
        return LITERAL
    return next(p for p in PATHS if p.accepts(spec))

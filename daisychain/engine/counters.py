"""How many times the INT8 units run: multiply, requantize and ReLU invocations as a pure
function of the model shape and the number of micro-batches computed.

Every product in a unit GEMM is one multiply-unit invocation (the engine folds some of them
into exact BLAS calls, which give the same bits as reading each product from the table, so
they count the same). Per micro-batch of ``b`` samples, for each linear layer ``(in, out)``:

- forward ``a @ W.T``: ``b * in * out`` multiplies;
- weight gradient ``G.T @ a``: ``b * in * out`` multiplies;
- error ``G @ W`` into the layer below: ``b * in * out`` multiplies, for every linear that
  is not the first layer (and for the first when an embedding feeds it);
- requantize: ``b * out`` after every linear that is not the last (forward), and
  ``b * in`` for every error that is passed into a linear below (backward);
- ReLU: ``b * width`` per ReLU layer (forward; the backward mask reads its output);
- conv2d ``(Ci -> Co, k x k, H x W)``: as a linear with ``b * H * W`` rows, ``in = Ci*k*k``
  and ``out = Co`` (im2col), its forward requantize ``b * Co * H * W`` and the error it
  passes down ``b * Ci * H * W``; maxpool2d runs no unit (a max of int8 values).

Each layer type's count is its registry class's ``units`` (engine/layers.py); a sequence
model's layers after its posembed count ``b * T`` rows. A transformer block (engine/
attention.py) also reads the exp unit ``b * H * T * (T + 1) / 2`` times (its ``exp_units``;
the ``exp`` key appears only for a model that has a block).

The same formula is used by the page (``webui/engine/counters.js``, held to it by
``tests/units/test_counters_js.py``), the CLI and the demo.
"""

from __future__ import annotations

from daisychain.engine.layers import kind_of
from daisychain.engine.spec import ModelSpec


def unit_counts_per_micro_batch(spec: ModelSpec, micro_batch: int) -> dict[str, int]:
    """Unit invocations for one micro-batch of ``micro_batch`` samples (forward + backward)."""
    b = int(micro_batch)
    mul = rq = relu = exp = 0
    rows = b
    for i, l in enumerate(spec.layers):
        if kind_of(l).sequence:  # a sequence model: the layers after it see b * T rows
            rows = b * spec.input_dim
        m, r, u = kind_of(l).units(l, rows, i, spec.layers)
        mul, rq, relu = mul + m, rq + r, relu + u
        exp += kind_of(l).exp_units(l, b)
    out = {"multiply": mul, "requantize": rq, "relu": relu}
    if spec.uses_exp:  # the key exists only for a model that reads the exp unit
        out["exp"] = exp
    return out


def unit_counts(spec: ModelSpec, micro_batch: int, micro_batches: int) -> dict[str, int]:
    """Unit invocations for ``micro_batches`` micro-batches of ``micro_batch`` samples."""
    per = unit_counts_per_micro_batch(spec, micro_batch)
    return {k: v * int(micro_batches) for k, v in per.items()}


def format_counts(counts: dict[str, int]) -> str:
    """One line for logs: ``units: multiply 1.23e+09 · requantize 4.5e+06 · relu 2.1e+06``."""
    return "units: " + " · ".join(f"{k} {v:,}" for k, v in counts.items())

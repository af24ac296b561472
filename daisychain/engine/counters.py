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
- ReLU: ``b * width`` per ReLU layer (forward; the backward mask reads its output).

The same formula is used by the page (``webui/counters.js``, held to it by
``tests/test_counters_js.py``), the CLI and the demo.
"""

from __future__ import annotations

from daisychain.engine.spec import ModelSpec


def unit_counts_per_micro_batch(spec: ModelSpec, micro_batch: int) -> dict[str, int]:
    """Unit invocations for one micro-batch of ``micro_batch`` samples (forward + backward)."""
    b = int(micro_batch)
    mul = rq = relu = 0
    layers = spec.layers
    linears = [i for i, l in enumerate(layers) if l.type == "linear"]
    has_emb = layers[0].type == "embedding"
    width = 0
    for i, l in enumerate(layers):
        if l.type == "linear":
            mul += 2 * b * l.n_in * l.n_out  # forward + weight gradient
            first = i == linears[0]
            if not first or has_emb:
                mul += b * l.n_in * l.n_out  # error into the layer below
            if not first:
                rq += b * l.n_in  # that error is requantized before the next GEMM
            if i != linears[-1]:
                rq += b * l.n_out  # forward activation
            width = l.n_out
        elif l.type == "relu":
            relu += b * width
    return {"multiply": mul, "requantize": rq, "relu": relu}


def unit_counts(spec: ModelSpec, micro_batch: int, micro_batches: int) -> dict[str, int]:
    """Unit invocations for ``micro_batches`` micro-batches of ``micro_batch`` samples."""
    per = unit_counts_per_micro_batch(spec, micro_batch)
    return {k: v * int(micro_batches) for k, v in per.items()}


def format_counts(counts: dict[str, int]) -> str:
    """One line for logs: ``units: multiply 1.23e+09 · requantize 4.5e+06 · relu 2.1e+06``."""
    return "units: " + " · ".join(f"{k} {v:,}" for k, v in counts.items())

"""Unit-invocation counters: the formula in daisychain.engine.counters equals the products,
requantize and ReLU elements the table engine (gemm="lut") actually computes."""

from __future__ import annotations

import numpy as np
import pytest

from daisychain.engine.counters import unit_counts, unit_counts_per_micro_batch
from daisychain.engine.model import Engine, init_params
from daisychain.engine.spec import Layer, ModelSpec, char_mlp, mlp
from daisychain.units import load_luts


def _measured(spec: ModelSpec, n: int, b: int) -> dict[str, int]:
    eng = Engine(spec, load_luts(), gemm="lut")
    seen = {"multiply": 0, "requantize": 0, "relu": 0}
    mm, rq, relu = eng._mm, eng._requantize, eng._relu

    def count_mm(a, w):
        seen["multiply"] += int(a.shape[0] * a.shape[1] * a.shape[2] * w.shape[-1])
        return mm(a, w)

    def count_rq(acc, s):
        seen["requantize"] += int(acc.size)
        return rq(acc, s)

    def count_relu(q):
        seen["relu"] += int(q.size)
        return relu(q)

    eng._mm, eng._requantize, eng._relu = count_mm, count_rq, count_relu
    rng = np.random.default_rng(0)
    theta = init_params(spec, 3)
    if spec.input_kind == "dense":
        x = rng.standard_normal((n, b, spec.input_dim))
    else:
        x = rng.integers(0, spec.layers[0].n_in, (n, b, spec.input_dim))
    y = rng.integers(0, spec.classes, (n, b))
    eng.grad(theta, x, y, 40, 2.0**51)
    return seen


@pytest.mark.parametrize("spec", [mlp(8, 6, 3), mlp(8, 6, 3, depth=2),
                                  ModelSpec((Layer("linear", 5, 4),), "dense", 5, 4),
                                  char_mlp(7, 3, 2, 5)],
                         ids=["mlp1", "mlp2", "linear", "char"])
def test_formula_matches_what_the_engine_computes(spec):
    n, b = 3, 4
    assert _measured(spec, n, b) == unit_counts(spec, b, n)


def test_counts_scale_with_micro_batches():
    spec = mlp(64, 128, 10)
    per = unit_counts_per_micro_batch(spec, 16)
    assert per["multiply"] == 16 * (3 * 64 * 128 + 3 * 128 * 10 - 0) - 16 * 64 * 128
    assert unit_counts(spec, 16, 10) == {k: 10 * v for k, v in per.items()}

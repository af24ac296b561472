"""The quantized output error sums to zero over the classes, per sample (engine version 2).

q(p - onehot(y)) rounds most of a row's small probabilities to 0, so before version 2 a row
summed to about -(their mass): every step pushed the true class's logit up more than it
pushed the others down, and the text model's validation loss rose again after ~2,000 steps
(docs/LIMITS.md, docs/BENCHMARKS.md "The output error"). The output bias's gradient is
the column sum of those rows, so its entries must add up to zero in every engine path: the
literal engine, the fast numpy passes, the compiled kernels (test_engine_fast holds them to
each other) and the conv kernels. The JS engine is held to the same bits by the golden step
files (test_engine golden tests)."""

from __future__ import annotations

import numpy as np
import pytest

from daisychain.engine import fast as fast_mod
from daisychain.engine.data import model_for, prepare_task
from daisychain.engine.golden import image_digits
from daisychain.engine.model import Engine
from daisychain.engine.spec import Hyper
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts
from jsrun import run_js


def test_zero_sum_rows_and_the_clamp():
    from daisychain.engine.detmath import zero_sum_errors

    G = np.array([[3.0, -10.0, 4.0, 0.0], [0.0] * 4, [70.0, 60.0, -120.0, 0.0],
                  [66.0, 64.0, 0.0, -110.0], [1.0, 2.0, 2.0, -126.0]])
    y = np.array([1, 2, 2, 3, 3])
    got = zero_sum_errors(G.copy(), y)
    # y = 1: 3 + 4 + 0 -> -7; all zero -> +0; 130 -> -127 and 3 off the largest (70);
    # 66 + 64 = 130: 66 -> 65 -> 64 -> (a tie: class 0 first) 63; 5 -> -5
    assert got.tolist() == [[3, -7, 4, 0], [0, 0, 0, 0], [67, 60, -127, 0], [63, 64, 0, -127],
                            [1, 2, 2, -5]]
    assert (got.sum(axis=1) == 0).all()
    assert not np.signbit(got[1, 2])  # 0 - 0 is +0, as in JS
    # any leading shape, the labels following it
    G3 = G.reshape(1, 5, 4).copy()
    assert np.array_equal(zero_sum_errors(G3, y.reshape(1, 5)), got.reshape(1, 5, 4))


def _output_bias_sums(task, hidden, ds=None, gemm="fast", steps=3):
    """Per micro-batch of the first steps, the sum over classes of the output bias's
    fixed-point gradient (exact: every micro-batch's scale 2**(eg + S) is an integer here)."""
    ds = ds or prepare_task(task)
    hp = Hyper(seed=3)
    spec = model_for(ds, hidden)
    tr = Trainer(spec, hp, ds, load_luts())
    if gemm != "fast":
        tr.engine = Engine(spec, load_luts(), gemm=gemm)
    assert tr.layout.shapes[-1] == (spec.classes,)  # the last tensor is the output bias
    sums = []
    for step in range(steps):
        for j in range(hp.n_micro):
            g = tr.contribute([j], step=step).grad
            sums.append(int(g[-spec.classes:].sum()))
        tr.apply(tr.contribute(list(range(hp.n_micro))).grad)
    return sums


@pytest.mark.parametrize("task,hidden,gemm", [("text", 32, "fast"), ("text", 32, "lut"),
                                              ("digits", (32, 24), "fast")])
def test_output_bias_gradient_sums_to_zero(task, hidden, gemm, monkeypatch):
    monkeypatch.setattr(fast_mod, "COMPILED_AFTER_S", 0.0)  # the compiled kernels at once
    sums = _output_bias_sums(task, hidden, gemm=gemm)
    assert sums == [0] * len(sums)


def test_conv_output_bias_gradient_sums_to_zero():
    ds = image_digits(1)
    sums = _output_bias_sums("digits-image", ("conv4", "pool", 12), ds=ds, steps=2)
    assert sums == [0] * len(sums)


def _rows(seed=0, n=400, C=9):
    """Quantized-error-like rows: the others >= 0 (some far above a fair share, so the
    excess rule runs), the true class <= 0."""
    rng = np.random.default_rng(seed)
    G = rng.integers(0, 40, (n, C)).astype(np.float64)
    G[rng.random((n, C)) < 0.4] = 0.0
    y = rng.integers(0, C, n)
    G[np.arange(n), y] = -rng.integers(0, 128, n)
    return G, y


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_js_zero_sum_errors_is_pythons():
    from daisychain.engine.detmath import zero_sum_errors

    G, y = _rows()
    want = zero_sum_errors(G.copy(), y)
    assert (want.sum(axis=1) == 0).all()
    assert (np.abs(want) <= 127).all() and (want >= 0).sum() > 0
    assert (G.sum(axis=1) - G[np.arange(len(y)), y] > 127).sum() > 20  # the excess rule ran
    got = run_js("""
      const G = Int32Array.from(DATA.G);
      D.zeroSumErrors(G, DATA.y, DATA.y.length, DATA.C);
      console.log(JSON.stringify(Array.from(G)));""", imports={"D": "engine/detmath.js"},
                 data={"G": G.astype(int).ravel().tolist(), "y": y.tolist(), "C": G.shape[1]})
    assert got == want.astype(int).ravel().tolist()


def test_a_version_1_checkpoint_is_refused_in_words():
    """A checkpoint made before the zero-sum step cannot continue its bits under version 2:
    resuming it says so and changes nothing."""
    from daisychain import ENGINE_VERSION
    from daisychain.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    ds = prepare_task("digits")
    tr = Trainer(model_for(ds, 16), Hyper(seed=1), ds, load_luts())
    tr.apply(tr.contribute(list(range(tr.hp.n_micro))).grad)
    old = save_checkpoint({**tr.identity, "engine": "1"}, 1, tr.state.theta, tr.state.adam)
    assert load_checkpoint(old).identity["engine"] == "1"  # it still loads (export, PyTorch)
    with pytest.raises(CheckpointError, match=f"another run: engine version: {ENGINE_VERSION} here, 1 in the checkpoint"):
        load_checkpoint(old, tr.identity)

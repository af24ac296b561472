"""The engine's fast path (daisychain/engine/fast.py) gives the same bits as the literal
engine (every product, requantize and ReLU read from its table), including the cases where
its shortcuts must step aside: clamps that act, float32 bounds exceeded, unfoldable
weight gradients, inner sizes above 1024. And Adam's in-place update never writes into an
array handed to it from outside."""

from __future__ import annotations

import numpy as np
import pytest

from daisychain.engine.adam import AdamState, adam_step
from daisychain.engine.model import Engine, init_params
from daisychain.engine.spec import Hyper, Layer, ModelSpec, mlp
from daisychain.units import load_luts


def _both(spec):
    luts = load_luts()
    fast, lit = Engine(spec, luts), Engine(spec, luts, gemm="lut")
    assert fast.fast is not None and lit.fast is None
    return fast, lit


def _same(spec, theta, x, y, S=40, limit=2.0**49):
    fast, lit = _both(spec)
    a, b = fast.grad(theta, x, y, S, limit), lit.grad(theta, x, y, S, limit)
    assert np.array_equal(a.grad, b.grad)
    assert a.loss.tobytes() == b.loss.tobytes()
    assert np.array_equal(a.correct, b.correct)
    za, zb = fast.forward(theta, x)[0], lit.forward(theta, x)[0]
    assert za.tobytes() == zb.tobytes()


SPECS = {"1x24": mlp(16, 24, 5), "2x24": mlp(16, 24, 5, depth=2), "3x12": mlp(16, 12, 5, depth=3),
         "linear-linear": ModelSpec((Layer("linear", 16, 9), Layer("linear", 9, 5)), "dense", 16, 5),
         "linear": ModelSpec((Layer("linear", 16, 5),), "dense", 16, 5)}


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("case", ["plain", "zeros", "mixed-scales", "huge", "tiny", "S0", "S60", "clamped",
                                  "spread"])
def test_fast_path_equals_the_literal_engine(name, case):
    spec = SPECS[name]
    rng = np.random.default_rng(abs(hash((name, case))) % 2**32)
    theta = init_params(spec, 7)
    x = rng.uniform(-16, 16, (4, 6, 16))
    y = rng.integers(0, 5, (4, 6))
    S, limit = 40, 2.0**49
    if case == "zeros":
        x[1] = 0.0
    elif case == "mixed-scales":  # per-micro-batch exponents far apart: unfoldable spread
        x *= np.array([1.0, 2.0**-12, 2.0**9, 2.0**-30])[:, None, None]
    elif case == "spread":  # exponents a few apart: one float64 weight-gradient GEMM
        x *= np.array([1.0, 2.0**-5, 2.0**4, 2.0**-7])[:, None, None]
    elif case == "huge":
        theta = theta * 1e6
        x *= 1e20
    elif case == "tiny":
        theta = theta * 1e-9
    elif case == "S0":
        S = 0  # e + S < 0: rounded, not folded
    elif case == "S60":
        S = 60
    elif case == "clamped":
        limit = 3.0  # every fixed-point value clamps
    _same(spec, theta, x, y, S, limit)


def test_clamps_at_the_edges_act_as_in_the_tables():
    """Max |W| * 2**-e and the accumulators right at 127.5 (where the clamp matters)."""
    spec = mlp(8, 6, 3)
    rng = np.random.default_rng(1)
    for trial in range(40):
        theta = init_params(spec, trial)
        W = theta[:48]
        W[rng.integers(0, 48)] = np.sign(rng.standard_normal()) * 127.5 * 2.0**-8 * (1 + (trial % 3) * 2.0**-40)
        x = rng.integers(-127, 128, (3, 5, 8)).astype(np.float64)
        x[:, 0, 0] = 127.5 * (-1) ** trial  # input quantization clamps
        y = rng.integers(0, 3, (3, 5))
        _same(spec, theta, x, y)


def test_big_biases_and_wide_layers_leave_float32():
    # accumulator + bias beyond 2**24: the layer is redone in float64
    spec = mlp(8, 6, 3)
    theta = init_params(spec, 2)
    theta[48:54] = 3e4  # bias of the hidden layer, in accumulator units ~2**25
    rng = np.random.default_rng(2)
    _same(spec, theta, rng.uniform(0, 1, (2, 4, 8)), rng.integers(0, 3, (2, 4)))
    # K > 1024: float64 GEMMs
    spec = mlp(1100, 4, 3)
    _same(spec, init_params(spec, 3), rng.uniform(-1, 1, (2, 3, 1100)), rng.integers(0, 3, (2, 3)))


def test_many_micro_batches_and_one_sample_each():
    spec = mlp(16, 24, 5, depth=2)
    rng = np.random.default_rng(4)
    _same(spec, init_params(spec, 4), rng.uniform(0, 16, (80, 1, 16)), rng.integers(0, 5, (80, 1)))
    _same(spec, init_params(spec, 4), rng.uniform(0, 16, (2, 70, 16)), rng.integers(0, 5, (2, 70)))
    small = mlp(4, 3, 2)  # one micro-batch of 1100 samples: its weight-gradient GEMM in float64
    _same(small, init_params(small, 4), rng.uniform(0, 16, (1, 1100, 4)), rng.integers(0, 2, (1, 1100)),
          S=30, limit=2.0**51)


def test_adam_never_writes_into_arrays_from_outside():
    hp = Hyper(weight_decay=0.01)
    rng = np.random.default_rng(5)
    m0, v0 = rng.standard_normal(50) * 1e-3, rng.uniform(0, 1e-6, 50)
    m_in, v_in = m0.copy(), v0.copy()
    m_in.flags.writeable = False  # e.g. a received state decoded from a frame
    st = AdamState(m_in, v_in, step=3, b1t=0.9**3, b2t=0.999**3)
    theta, g = rng.standard_normal(50), rng.standard_normal(50) * 1e-3
    want_theta = theta.copy()
    for _ in range(3):
        adam_step(theta, st, g, hp)
    assert np.array_equal(m_in, m0) and np.array_equal(v_in, v0)
    # the documented expression order, with fresh arrays
    m, v, b1t, b2t = m0, v0, 0.9**3, 0.999**3
    for _ in range(3):
        b1t, b2t = b1t * hp.beta1, b2t * hp.beta2
        m = hp.beta1 * m + (1.0 - hp.beta1) * g
        v = hp.beta2 * v + (1.0 - hp.beta2) * (g * g)
        u = (m / (1.0 - b1t)) / (np.sqrt(v / (1.0 - b2t)) + hp.eps)
        want_theta = want_theta - (hp.lr * u + (hp.lr * hp.weight_decay) * want_theta)
    assert theta.tobytes() == want_theta.tobytes()
    assert st.m.tobytes() == m.tobytes() and st.v.tobytes() == v.tobytes()


def _documented_adam(theta, m, v, b1t, b2t, g, hp, steps):
    """The expression order of docs/ENGINE.md with fresh numpy arrays (one op per line)."""
    for _ in range(steps):
        b1t, b2t = b1t * hp.beta1, b2t * hp.beta2
        m = hp.beta1 * m + (1.0 - hp.beta1) * g
        v = hp.beta2 * v + (1.0 - hp.beta2) * (g * g)
        u = (m / (1.0 - b1t)) / (np.sqrt(v / (1.0 - b2t)) + hp.eps)
        if hp.weight_decay:
            theta = theta - (hp.lr * u + (hp.lr * hp.weight_decay) * theta)
        else:
            theta = theta - hp.lr * u
    return theta, m, v


@pytest.mark.parametrize("wd", [0.0, 0.01])
@pytest.mark.parametrize("n_micro", [4, 3])
def test_fused_adam_on_the_integer_total_equals_the_documented_order(wd, n_micro):
    """The compiled single pass (numba) that takes the int64 total and the mean-gradient
    scaling gives the bits of mean_grad then the documented Adam expressions, with and
    without weight decay, for a power-of-two and another micro-batch count; and it is the
    path actually taken for a vector this long."""
    from daisychain.engine import adam as adam_mod

    size = adam_mod.FUSED_MIN_SIZE + 37
    rng = np.random.default_rng(11)
    hp = Hyper(weight_decay=wd)
    total = (rng.standard_normal(size) * 2.0**36).astype(np.int64)
    total[:5] = [0, 1, -1, 2**50, -(2**50)]
    gscale = 2.0**-40 if n_micro == 3 else 2.0**-42
    gdiv = float(n_micro) if n_micro == 3 else 1.0
    theta0 = rng.standard_normal(size)
    m0, v0 = rng.standard_normal(size) * 1e-3, rng.uniform(0, 1e-6, size)
    theta = theta0.copy()
    st = AdamState(m0.copy(), v0.copy(), step=2, b1t=0.9**2, b2t=0.999**2)
    for _ in range(3):
        adam_step(theta, st, total, hp, gscale, gdiv)
    assert adam_mod._fused_kernel() is not None  # numba is a dependency: the fused pass ran
    g = np.multiply(total, gscale, dtype=np.float64)
    g = g / gdiv if gdiv != 1.0 else g
    want = _documented_adam(theta0, m0, v0, 0.9**2, 0.999**2, g, hp, 3)
    assert theta.tobytes() == want[0].tobytes()
    assert st.m.tobytes() == want[1].tobytes() and st.v.tobytes() == want[2].tobytes()


def test_two_layer_training_hash_is_the_same_with_and_without_numba(monkeypatch):
    """A 2-hidden-layer model (its parameter vector takes the fused Adam pass) ends on the
    same params-sha256 when the fused pass is switched off (numpy passes)."""
    from daisychain.engine import adam as adam_mod
    from daisychain.engine.data import prepare_task
    from daisychain.engine.trainer import Trainer

    spec, hp, ds = mlp(64, 96, 10, depth=2), Hyper(), prepare_task("digits")
    assert sum(int(np.prod(s)) for _, s in spec.param_shapes()) >= adam_mod.FUSED_MIN_SIZE
    hashes = []
    for off in (False, True):
        if off:
            monkeypatch.setenv("DAISYCHAIN_NO_NUMBA", "1")
            monkeypatch.setattr(adam_mod, "_fused", None)
        tr = Trainer(spec, hp, ds, load_luts())
        for _ in range(5):
            tr.apply(tr.contribute(list(range(hp.n_micro))).grad)
        hashes.append(tr.params_sha256())
    assert adam_mod._fused_kernel() is None
    assert hashes[0] == hashes[1]


@pytest.mark.parametrize("e, limit, path", [
    ([-38, -39, -37, -38], 2.0**49, "one float32 GEMM"),
    ([-40, -33, -36, -38], 2.0**49, "one float64 GEMM"),
    ([-40] + [-7] * 7, 2.0**51, "float32 GEMMs by exponent"),
    ([-41, -40, -39, -40], 2.0**49, "per micro-batch (e + S < 0)"),
])
def test_weight_gradient_fold_equals_the_per_micro_batch_fixed_point_sum(e, limit, path):
    """Every way _weight_grad folds the micro-batches (chosen by the spread of their
    exponents and the bounds) gives the per-micro-batch fixed-point values summed in int64."""
    from daisychain.engine.fast import FastPath, _fixed_sum

    rng = np.random.default_rng(len(path))
    n, b, k_in, k_out = len(e), 16, 40, 24
    G = rng.integers(-127, 128, (n * b, k_out)).astype(np.float32)
    a = rng.integers(-127, 128, (n * b, k_in)).astype(np.float32)
    e = np.array(e)
    dW = np.einsum("nbo,nbi->noi", G.reshape(n, b, -1).astype(np.int64),
                   a.reshape(n, b, -1).astype(np.int64))  # exact integers
    want = _fixed_sum(dW.astype(np.float64), e, 40, limit).ravel()
    for scale_g in (False, True):  # either operand may be the one scaled
        Gs, As = (a, G) if scale_g else (G, a)
        got = np.empty(k_in * k_out, np.int64)
        FastPath._weight_grad(got, Gs, As, n, e, 40, limit, np.empty((Gs.shape[1], As.shape[1]), np.float32))
        ref = want if not scale_g else _fixed_sum(dW.transpose(0, 2, 1).astype(np.float64), e, 40, limit).ravel()
        assert np.array_equal(got, ref), path

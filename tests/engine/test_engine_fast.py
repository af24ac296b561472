"""The engine's fast path (daisychain/engine/fast.py) gives the same bits as the literal
engine (every product, requantize and ReLU read from its table), both its numpy passes and
its compiled kernels (numba), including the cases where its shortcuts must step aside:
clamps that act, float32 bounds exceeded, unfoldable weight gradients, inner sizes above
1024, exponents outside the compiled kernels' range. And Adam's in-place update never
writes into an array handed to it from outside."""

from __future__ import annotations

import numpy as np
import pytest

from daisychain.engine import detmath, fast as fast_mod, kernels
from daisychain.engine.adam import AdamState, adam_step
from daisychain.engine.model import Engine, init_params
from daisychain.engine.spec import Hyper, Layer, ModelSpec, mlp
from daisychain.units import load_luts


@pytest.fixture(autouse=True)
def _compiled_at_once(monkeypatch):
    """Engines here take the compiled kernels from their first call."""
    monkeypatch.setattr(fast_mod, "COMPILED_AFTER_S", 0.0)


def _kern():
    k = kernels.compiled()
    assert k is not None  # numba is a dependency
    return k


def _both(spec):
    luts = load_luts()
    fast, lit = Engine(spec, luts), Engine(spec, luts, gemm="lut")
    assert fast.fast is not None and lit.fast is None
    return fast, lit


def _same(spec, theta, x, y, S=40, limit=2.0**49, compiled=True):
    """The literal engine, the fast path as dispatched, its numpy passes and its compiled
    kernels give the same bits. ``compiled``: whether the kernels must take the case
    (True), must refuse it (False) or may do either (None)."""
    fast, lit = _both(spec)
    b = lit.grad(theta, x, y, S, limit)
    fp = fast.fast
    nb = fp._grad_nb(_kern(), theta, x, y, S, limit)
    if compiled is not None:
        assert (nb is not None) == compiled
    got = [fast.grad(theta, x, y, S, limit), fp._grad_np(theta, x, y, S, limit)]
    if nb is not None:
        got.append(nb)
    for g in got:
        grad, loss, correct = (g.grad, g.loss, g.correct) if hasattr(g, "grad") else g
        assert np.array_equal(grad, b.grad)
        assert loss.tobytes() == b.loss.tobytes()
        assert np.array_equal(correct, b.correct)
    zb = lit.forward(theta, x)[0]
    zs = [fast.forward(theta, x)[0], fp._forward_np(theta, x)[0]]
    znb = fp._forward_nb(_kern(), theta, x, fresh=True)
    if compiled:
        assert znb is not None
    if znb is not None:
        zs.append(znb[0])
    for z in zs:
        assert z.tobytes() == zb.tobytes()


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
    # K > 1024: float64 GEMMs (numpy passes only)
    spec = mlp(1100, 4, 3)
    _same(spec, init_params(spec, 3), rng.uniform(-1, 1, (2, 3, 1100)), rng.integers(0, 3, (2, 3)),
          compiled=False)


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


@pytest.mark.parametrize("hidden", [(64, 96, 10, 2), (64, 48, 10, 1)])
def test_training_hash_is_the_same_with_and_without_numba(monkeypatch, hidden):
    """A 2-hidden-layer model (its parameter vector takes the fused Adam pass at any time)
    and a small 1-layer one (fused once numba is imported) end on the same params-sha256
    with numba (compiled kernels and fused Adam) and without it (numpy passes)."""
    from daisychain.engine import adam as adam_mod
    from daisychain.engine.data import prepare_task
    from daisychain.engine.trainer import Trainer

    f, h, c, depth = hidden
    spec, hp, ds = mlp(f, h, c, depth=depth), Hyper(), prepare_task("digits")
    hashes = []
    for off in (False, True):
        if off:
            monkeypatch.setenv("DAISYCHAIN_NO_NUMBA", "1")
            monkeypatch.setattr(adam_mod, "_fused", None)
            monkeypatch.setattr(kernels, "_compiled", None)
        tr = Trainer(spec, hp, ds, load_luts())
        for _ in range(5):
            tr.apply(tr.contribute(list(range(hp.n_micro))).grad)
        hashes.append(tr.params_sha256())
        assert (tr.engine.fast._kernels() is None) == off
        assert (adam_mod._fused_kernel() is None) == off
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
    from daisychain.engine.fast import FastPath
    from daisychain.engine.kernels import fixed_sum as _fixed_sum

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


# ---------------------------------------------------------------- the compiled kernels


@pytest.mark.parametrize("case", ["x-huge-exponent", "x-tiny-exponent", "W-tiny-exponent"])
def test_compiled_kernels_step_aside_outside_their_range(case):
    """Exponents beyond +-900: the kernels refuse, the numpy passes run, and the bits are
    the literal engine's. (A subnormal maximum, also refused, see the quantize test, has
    no finite scale 2**-e even in the literal engine.)"""
    spec = mlp(16, 24, 5, depth=2)
    rng = np.random.default_rng(21)
    theta = init_params(spec, 3)
    x = rng.uniform(-16, 16, (3, 4, 16))
    if case == "x-huge-exponent":
        x[1] *= 2.0**950
    elif case == "x-tiny-exponent":
        x[2] *= 2.0**-1000
    else:
        theta[:16 * 24] *= 2.0**-960
    _same(spec, theta, x, rng.integers(0, 5, (3, 4)), compiled=False)


def test_compiled_path_takes_the_real_models_and_big_biases():
    """The models of bench/train.py on digits-like inputs, and biases far beyond 2**24 in
    accumulator units (exact in the kernels' integers), take the compiled kernels."""
    rng = np.random.default_rng(22)
    for spec in (mlp(64, 128, 10), mlp(64, 256, 10, depth=2)):
        x = rng.integers(0, 17, (4, 16, 64)).astype(np.float64)
        _same(spec, init_params(spec, 5), x, rng.integers(0, 10, (4, 16)))
    spec = mlp(8, 6, 3)
    theta = init_params(spec, 2)
    theta[48:54] = [3e4, -3e4, 1e9, -1e9, 0.0, 2.5e4]  # some clamp at +-2**30
    _same(spec, theta, rng.uniform(0, 1, (2, 4, 8)), rng.integers(0, 3, (2, 4)))


def _edge_rows(rng, F):
    """Rows that hit the quantizer's edges: zeros, maxima exactly at the clamp (127.5 *
    2**e rounds up to 128 and clamps), just below it, half-way values, huge and tiny
    exponents, negative maxima."""
    rows = [np.zeros(F), rng.uniform(-1, 1, F), rng.uniform(-1, 1, F) * 2.0**800,
            rng.uniform(-1, 1, F) * 2.0**-800, -rng.uniform(0, 3, F)]
    for e in (-3, 0, 5, 40):
        r = rng.integers(-255, 256, F) * 0.5 * 2.0**e  # many exact halves
        r[0] = 127.5 * 2.0**e  # max: clamps at 127 after rounding up
        r[1] = -127.5 * 2.0**e
        rows.append(r)
        r = r.copy()
        r[0], r[1] = np.nextafter(127.5, 0) * 2.0**e, 64.0 * 2.0**e
        rows.append(r)
    return np.array(rows)


def test_quantize_kernel_equals_the_numpy_quantize():
    rng = np.random.default_rng(23)
    k = _kern()
    x = _edge_rows(rng, 37)
    out, e = np.empty(x.shape, np.float32), np.empty(len(x), np.int64)
    assert k.quant_rows(x, out, e)
    m = fast_mod._absmax(x)
    want_e = fast_mod._qexp(m)
    want = fast_mod._quantize(x, np.ldexp(1.0, -want_e)[:, None], m, np.empty(x.shape, np.float32))
    assert np.array_equal(e, want_e)
    assert out.tobytes() == want.tobytes()
    # and the definition itself (detmath.quantize, float64)
    assert np.array_equal(out, detmath.quantize(x, want_e[:, None]))
    for bad in (np.inf, -np.inf, np.nan, 5e-324, 2.0**950):
        y = x.copy()
        y[3, 5] = bad
        if bad == 5e-324:
            y[3] = bad
        assert not k.quant_rows(y, out, e), bad


def test_dexp_kernel_equals_detmath_dexp():
    """Every multiply and add of the polynomial separate, in order: a fused multiply-add or
    a reordering would change the last bits of many of these."""
    _kern()
    rng = np.random.default_rng(24)
    LN2 = 0.6931471805599453
    x = np.concatenate([rng.uniform(-85, 0, 4000), -rng.exponential(1.0, 2000),
                        -np.arange(0, 120) * LN2 / 2, -np.arange(0, 120) * LN2 / 2 - 1e-13,
                        [0.0, -0.0, -80.0, np.nextafter(-80.0, 0), -80.0 - 1e-9, -1e-300, -5e-324]])
    want = detmath.dexp(x)
    got = np.array([kernels._nb_dexp(v) for v in x])
    assert got.tobytes() == want.tobytes()


def test_output_error_kernel_equals_the_numpy_one():
    k = _kern()
    rng = np.random.default_rng(25)
    n, b, C = 3, 7, 10
    z = rng.standard_normal((n, b, C)) * np.array([1.0, 30.0, 1e-3])[:, None, None]
    z[0, 0, :] = 2.5  # all tied: argmax is class 0
    z[0, 1, 3] = z[0, 1, 7] = z[0, 1].max() + 1  # two maxima: the first counts
    z[1, 2, 4] = 1e5  # the others far below exp's clamp
    y = rng.integers(0, C, (n, b))
    y[0, 1] = 7
    p, loss, correct = Engine(mlp(4, 3, C), load_luts()).fast.output_error(z.copy(), y)
    dz, py, corr = np.empty((n * b, C)), np.empty(n * b), np.empty(n, np.int64)
    assert k.output_error(z.reshape(n * b, C), y.reshape(-1).astype(np.int64), b, dz, py, corr)
    assert dz.tobytes() == p.reshape(n * b, C).tobytes()
    assert np.array_equal(corr, correct)
    want_py = Engine.softmax(z.copy())[np.arange(n)[:, None], np.arange(b)[None, :], y]
    assert py.tobytes() == want_py.reshape(-1).tobytes()
    y[2, 3] = C  # a label out of range: refused
    assert not k.output_error(z.reshape(n * b, C), y.reshape(-1).astype(np.int64), b, dz, py, corr)


def _round_shift_ref(v, lo):
    """The definition in float64: s = max(0, exponent(max|v|) - 7) per micro-batch,
    clamp(floor(v * 2**-s + 1/2), lo, 127)."""
    s = np.maximum(detmath.exponent(np.abs(v).reshape(v.shape[0], -1).max(axis=1)) - 7, 0)
    q = np.clip(np.floor(v * detmath.pow2(-s)[:, None, None] + 0.5), lo, 127)
    return q, s


@pytest.mark.parametrize("lo", [0, -127])
def test_requantize_kernels_equal_the_definitions(lo):
    """Forward (accumulator + bias, then the rounding shift, clamped at lo or -127..127)
    and backward (ReLU mask, rounding shift) kernels against float64 definitions, with
    micro-batches of all zeros, of small values (shift 0), of values near 2**24, and
    biases that clamp at +-2**30."""
    k = _kern()
    rng = np.random.default_rng(26 - lo)
    n, b, O = 5, 6, 9
    mags = np.array([0, 100, 2**12, 2**24 - 1, 3000])
    acc = np.stack([rng.integers(-m, m + 1, (b, O)) for m in mags]).astype(np.float32)
    acc[3, 0, 0] = -(2**24 - 1)
    bias = rng.standard_normal(O) * np.array([1, 1e-3, 1e3, 1e9, -1e9, 0.5, 0, 2.0**20, 1])
    ex, ew = np.array([-5, 0, 3, -40, 12]), -9
    sexp = ex + ew
    bacc = np.clip(np.floor(bias[None, :] * detmath.pow2(-sexp)[:, None] + 0.5), -2.0**30, 2.0**30)
    assert np.abs(bacc).max() == 2.0**30
    want, s = _round_shift_ref(acc.astype(np.float64) + bacc[:, None, :], lo)
    got, ex_out = acc.reshape(n * b, O).copy(), np.empty(n, np.int64)
    assert k.hidden(got, bias, ex, ew, b, lo, ex_out, np.empty(O, np.int64))
    assert np.array_equal(got.reshape(n, b, O), want) and np.array_equal(ex_out, sexp + s)
    # logits: (acc + bacc) * 2**sexp
    z = np.empty((n * b, O))
    assert k.logits(acc.reshape(n * b, O), bias, ex, ew, b, z, np.empty(O, np.int64))
    want_z = (acc.astype(np.float64) + bacc[:, None, :]) * detmath.pow2(sexp)[:, None, None]
    assert z.tobytes() == want_z.reshape(n * b, O).tobytes()
    # backward: mask where the previous ReLU output was 0, then the rounding shift
    a_in = rng.integers(-2, 3, (n, b, O)).astype(np.float32)
    for relu in (True, False):
        dX = acc.copy()
        v = dX.astype(np.float64) * (a_in > 0) if relu else dX.astype(np.float64)
        want, s = _round_shift_ref(v, -127)
        got, eg_out = dX.reshape(n * b, O), np.empty(n, np.int64)
        k.backward_hidden(got, a_in.reshape(n * b, O), relu, b, ex, ew, eg_out)
        assert np.array_equal(got.reshape(n, b, O), want) and np.array_equal(eg_out, ex + ew + s)


@pytest.mark.parametrize("e, limit", [
    ([-38, -39, -37, -38], 2.0**49),
    ([-40, -33, -36, -38], 2.0**49),
    ([-40] + [-7] * 7, 2.0**51),
    ([-41, -40, -39, -40], 2.0**49),
    ([-40, -20, -40, -40], 2.0**49),
    ([-30, -31, -30, -32], 3.0),  # clamps: not folded
])
@pytest.mark.parametrize("density", [1.0, 0.05])
def test_compiled_weight_gradient_equals_the_per_micro_batch_fixed_point_sum(e, limit, density):
    """The compiled fold (scaled rows, a bound on every partial sum, float32 / float64 /
    the numpy fallback) gives the per-micro-batch fixed-point values summed in int64, and
    its bound is at least the largest sum of |terms| of any element (so at least every
    partial sum of the GEMM, in any order). Sparse errors (density 0.05) make the bound
    far below the worst case, so the float32 GEMM takes spreads the old bound refused."""
    k = _kern()
    rng = np.random.default_rng(int(density * 100) + len(e))
    n, b, k_in, k_out = len(e), 16, 40, 24
    G = (rng.integers(-127, 128, (n * b, k_out)) * (rng.random((n * b, k_out)) < density)).astype(np.float32)
    G[::b, 0] = 127  # every micro-batch's max is 127
    a = rng.integers(-127, 128, (n * b, k_in)).astype(np.float32)
    e = np.array(e)
    eg, ex = e - 3, np.full(n, 3)
    dW = np.einsum("nbo,nbi->noi", G.reshape(n, b, -1).astype(np.int64), a.reshape(n, b, -1).astype(np.int64))
    want = kernels.fixed_sum(dW.astype(np.float64), e, 40, limit).ravel()
    fp = Engine(mlp(k_in, k_out, 3), load_luts()).fast
    got = np.empty(k_in * k_out, np.int64)
    fp._weight_grad_nb(k, got, G, a, n, b, eg, ex, 40, limit, 0)
    assert np.array_equal(got, want)
    for scale_a in (True, False):
        sc = np.empty(a.shape if scale_a else G.shape, np.float32)
        bound, kmin = k.wgrad_prep(G, a, eg, ex, 40, limit, b, scale_a, sc)
        kk = e + 40
        if kk.min() < 0 or b * 127**2 * 2.0**kk.max() > limit:
            assert bound == -1.0
            continue
        assert kmin == kk.min()
        w = 2 ** (kk - kmin)
        terms = np.einsum("nbo,nbi,n->oi", np.abs(G.reshape(n, b, -1)).astype(np.int64),
                          np.abs(a.reshape(n, b, -1)).astype(np.int64), w)
        assert bound >= terms.max()
        src = a if scale_a else G
        assert np.array_equal(sc, (src.reshape(n, b, -1) * w[:, None, None]).reshape(src.shape))


def test_two_layer_digits_training_is_the_literal_engines_bit_for_bit():
    """The 2-hidden-layer model of bench/train.py on digits: 12 steps through the compiled
    kernels and through the literal engine end on the same params-sha256."""
    from daisychain.engine.data import prepare_task
    from daisychain.engine.trainer import Trainer

    spec, hp, ds = mlp(64, 256, 10, depth=2), Hyper(), prepare_task("digits")
    a, b = (Trainer(spec, hp, ds, load_luts(), gemm=g) for g in ("fast", "lut"))
    for _ in range(12):
        for t in (a, b):
            t.apply(t.contribute(list(range(hp.n_micro))).grad)
        assert a.params_sha256() == b.params_sha256()
    assert a.engine.fast._kernels() is not None


def test_a_short_run_does_not_import_numba():
    """A few steps of the default model (numpy passes, numpy Adam) leave numba unimported:
    its import and first load (~0.75 s of CPU) would cost more than they save."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from daisychain.engine.data import prepare_task\n"
            "from daisychain.engine.spec import Hyper, mlp\n"
            "from daisychain.engine.trainer import Trainer\n"
            "from daisychain.units import load_luts\n"
            "tr = Trainer(mlp(64, 128, 10), Hyper(), prepare_task('digits'), load_luts())\n"
            "for _ in range(20):\n"
            "    tr.apply(tr.contribute([0, 1, 2, 3]).grad)\n"
            "tr.accuracy()\n"
            "assert 'numba' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("seed", range(4))
def test_random_models_and_scales_compiled_equals_the_literal_engine(seed):
    """Random dense models (1-3 hidden layers, or linear-linear), micro-batch counts and
    sizes, parameter and per-micro-batch input scales from 2**-60 to 2**60, a few huge
    parameters, zero micro-batches, integer inputs, S in 0..60 and clamps from 3 to 2**51:
    the compiled kernels, the numpy passes and the literal engine agree bit for bit."""
    rng = np.random.default_rng(100 + seed)
    luts = load_luts()
    for _ in range(15):
        F, H, C = (int(v) for v in (rng.integers(1, 40), rng.integers(1, 60), rng.integers(1, 12)))
        if rng.random() < 0.8:
            spec = mlp(F, H, C, depth=int(rng.integers(1, 4)))
        else:
            spec = ModelSpec((Layer("linear", F, H), Layer("linear", H, C)), "dense", F, C)
        n, b = int(rng.integers(1, 6)), int(rng.integers(1, 20))
        theta = init_params(spec, int(rng.integers(0, 1000))) * 2.0 ** int(rng.integers(-30, 30))
        if rng.random() < 0.3:
            theta[rng.integers(0, theta.size, 5)] *= 2.0 ** int(rng.integers(0, 40))
        x = rng.standard_normal((n, b, F)) * 2.0 ** rng.integers(-60, 60, (n, 1, 1))
        if rng.random() < 0.3:
            x[rng.integers(0, n)] = 0.0
        if rng.random() < 0.3:
            x = np.floor(x)
        S = int(rng.choice([0, 10, 20, 40, 60]))
        limit = float(rng.choice([3.0, 2.0**30, 2.0**49, float(2**51 // n)]))
        _same(spec, theta, x, rng.integers(0, C, (n, b)), S, limit)

"""The transformer's compiled route (engine/attnfast.py) against the numpy rules (engine/norm.py,
engine/attention.py), which are the definition: every rule on edge cases, then whole training
steps and every traced intermediate, byte for byte (issue 37)."""

from __future__ import annotations

import numpy as np
import pytest

from daisychain.engine import norm as N
from daisychain.engine.attention import softmax_back, softmax_int
from daisychain.engine.data import model_for, prepare_task
from daisychain.engine.spec import Hyper
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts

attnfast = pytest.importorskip("daisychain.engine.attnfast")
OPS = attnfast.attn_ops()
if OPS is None:  # pragma: no cover - numba is a dependency
    pytest.skip("no numba: the numpy rules run", allow_module_level=True)


class _Eng:
    """What the rules read from an engine: the exp table and the requantize by arithmetic."""

    def __init__(self, ops):
        self.exp_t = load_luts().exp.astype(np.float64)
        self.attn_ops = ops

    def _requantize(self, acc, s):
        x = np.multiply(acc, np.ldexp(1.0, -np.asarray(s)).reshape((-1,) + (1,) * (acc.ndim - 1)))
        x += 0.5
        np.floor(x, out=x)
        return np.clip(x, -127.0, 127.0, out=x)


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and np.array_equal(a, b), (a, b)


def _wide(rng, shape, bits):
    """Integers of up to ``bits`` bits, one micro-batch all zero, one with a single value."""
    v = rng.integers(-2**bits, 2**bits + 1, shape).astype(np.float64)
    v[1] = 0.0
    v[2] = 0.0
    v[2].flat[5] = -(2**bits)
    return v


@pytest.mark.parametrize("bits", [3, 15, 16, 30, 45])
def test_align_add_rq8_and_norm_rules_match_numpy(bits):
    from daisychain.engine.attention import _rq8

    rng = np.random.default_rng(bits)
    shape = (5, 24, 16)
    A, B, C = (_wide(rng, shape, b) for b in (bits, max(bits - 20, 1), 15))
    for es in ([0, 0, 0], [0, 30, -5], [-60, 2, 17], [3, -3, 45]):
        ops = [(V, np.array([e, e + 1, e - 40, e + 16, e - 17])) for V, e in zip((A, B, C), es)]
        for k in (2, 3):
            want, got = N.align_add(ops[:k]), OPS.align_add(ops[:k])
            _same(want[0], got[0])
            _same(want[1], got[1])
    e = np.array([-3, 0, 7, 12, -40])
    for V in (A, B, np.clip(A, -2**15, 2**15)):
        want, got = _rq8(_Eng(None), V, e), _rq8(_Eng(OPS), V, e)
        _same(want[0], got[0])
        _same(want[1], got[1])
    x = np.clip(A, -2**15, 2**15)
    y, cache = N.rms_forward(x)
    y2, cache2 = OPS.rms_forward(x)
    _same(y, y2)
    for a, b in zip(cache, cache2):
        _same(a, b)
    g = rng.integers(-127, 128, shape).astype(np.float64)
    g[3] = 0.0
    want, got = N.rms_backward(g, np.arange(5), np.arange(5) - 9, cache), OPS.rms_backward(g, np.arange(5),
                                                                                       np.arange(5) - 9, cache2)
    _same(want[0], got[0])
    _same(want[1], got[1])


def test_softmax_rules_match_numpy():
    rng = np.random.default_rng(7)
    T = 9
    for lo, hi, E in ((-127 * 127 * 16, 127 * 127 * 16, [-8, -7, -12]), (-3, 4, [-1, 0, 2]), (0, 1, [-8, -8, -8])):
        Sc = rng.integers(lo, hi, (3, 4, T, T)).astype(np.float64)
        Sc[0, 1] = 0.0
        want = softmax_int(_Eng(None), Sc, np.array(E))
        got = softmax_int(_Eng(OPS), Sc, np.array(E))
        _same(want, got)
        dP = rng.integers(-127 * 127 * 32, 127 * 127 * 32, (12, T, T)).astype(np.float64)
        P = want.reshape(12, T, T)
        _same(softmax_back(P, dP), softmax_back(P, dP, _Eng(OPS)))


@pytest.fixture(scope="module")
def text():
    return prepare_task("text")


def test_compiled_route_gives_the_numpy_routes_bytes(text):
    """Two blocks of width 16, 2 heads, context 8 (the golden model, step_text_gpt.json): every
    traced intermediate equal, then five steps with the same gradient bytes and parameters."""
    spec = model_for(text, ("block16h2", "block16h2"))
    fast, ref = (Trainer(spec, Hyper(seed=5), text, load_luts()) for _ in range(2))
    assert fast.engine.attn_ops is not None  # the "fast" GEMM route with exact tables chooses it
    ref.engine.attn_ops = None
    x, _ = fast.inputs(0, range(4))
    tf, tn = [], []
    zf, _ = fast.engine.forward(fast.theta, x, tf)
    zn, _ = ref.engine.forward(ref.theta, x, tn)
    assert zf.tobytes() == zn.tobytes()
    assert [k for k, _ in tf] == [k for k, _ in tn] and len(tf) > 50
    for (k, a), (_, b) in zip(tf, tn):
        assert np.array_equal(np.asarray(a), np.asarray(b)), k
    for _ in range(5):
        gf, gn = fast.contribute(range(4)).grad, ref.contribute(range(4)).grad
        assert gf.dtype == gn.dtype == np.int64 and gf.tobytes() == gn.tobytes()
        fast.apply(gf)
        ref.apply(gn)
    assert fast.params_sha256() == ref.params_sha256()


def test_one_sample_forward_as_sample_and_outputs_run_it(text):
    """One sample of one micro-batch (``daisychain sample``; a broadcast, read-only position
    table in the first align-add): the same logits on both routes."""
    spec = model_for(text, ("block16h2", "block16h2"))
    fast, ref = (Trainer(spec, Hyper(seed=5), text, load_luts()) for _ in range(2))
    ref.engine.attn_ops = None
    x, _ = fast.inputs(0, range(1))
    for xs in (x[:, :1], x[:, :3]):
        zf, _ = fast.engine.forward(fast.theta, xs)
        zn, _ = ref.engine.forward(ref.theta, xs)
        assert zf.tobytes() == zn.tobytes()
    assert fast.engine.outputs(fast.theta, x[0], 2).tobytes() == ref.engine.outputs(ref.theta, x[0], 2).tobytes()


def test_the_table_route_and_a_sequence_free_model_take_no_compiled_rules(text):
    spec = model_for(text, ("block16h2",))
    assert Trainer(spec, Hyper(seed=1), text, load_luts(), gemm="lut").engine.attn_ops is None
    assert Trainer(model_for(text), Hyper(seed=1), text, load_luts()).engine.attn_ops is None


@pytest.mark.parametrize("frac_bits, limit", [(40, 2.0**62), (12, 2.0**62), (40, 1000.0), (30, 50.0)])
def test_weight_gradient_matches_the_engines_own(text, frac_bits, limit):
    """The block's fc1 weight gradient: the engine's (its float64 fold or its literal route)
    and the compiled route's fixed-point sums are the same, the clamp at ``limit`` included."""
    eng = Trainer(model_for(text, ("block16h2",)), Hyper(seed=1), text, load_luts()).engine
    pi = eng.first_param[2] + 8
    M, D = eng.layout.shapes[pi]
    rng = np.random.default_rng(frac_bits)
    G = rng.integers(-127, 128, (3, 40, M)).astype(np.float64)
    A = rng.integers(-127, 128, (3, 40, D)).astype(np.float64)
    for e in (np.array([-30, -28, -33]), np.array([-50, -9, -20])):
        want = np.zeros(eng.layout.size, np.int64)
        got = np.zeros(eng.layout.size, np.int64)
        eng._weight_grad(want, pi, G, A, e, frac_bits, limit)
        OPS.weight_grad(eng, got, pi, G, A, e, frac_bits, limit)
        assert want.any() and want.tobytes() == got.tobytes()


def test_division_by_a_row_reciprocal_is_the_integer_division():
    """_nb_fdiv / _nb_sdiv_r (one reciprocal per row, corrected by one either way) against
    int64 floor division and norm.sdiv, at and beside the multiples of d, up to the bounds."""
    k = OPS.k
    rng = np.random.default_rng(3)
    for d in [1, 2, 3, 7, 254, 2**16 + 1, 2**31 - 1, 2**33 - 2]:
        inv = 1.0 / d
        qs = np.concatenate([np.arange(4), rng.integers(0, (2**51) // d, 200)])
        for p in {int(q * d + r) for q in qs for r in (-1, 0, 1, d - 1) if 0 <= q * d + r < 2**52}:
            assert k.fdiv(p, d, inv) == p // d, (p, d)
    a = rng.integers(-2**47, 2**47, 500)
    m = rng.integers(1, 2**31, 500)
    want = N.sdiv(a, m)
    got = [k.sdiv_r(int(x), int(y), 1.0 / (2.0 * int(y))) for x, y in zip(a, m)]
    assert np.array_equal(want, np.array(got))


def test_folded_weight_gradient_is_the_per_micro_batch_sum(text):
    """fold_grad (one int8 GEMM per exponent group, shifted in int64) against the literal
    per-micro-batch GEMM and fixed-point sum, with exponents that differ across micro-batches,
    and its refusal where a term could reach the clamp."""
    tr = Trainer(model_for(text, ("block16h2", "block16h2")), Hyper(seed=1), text, load_luts())
    eng = tr.engine
    rng = np.random.default_rng(4)
    G = rng.integers(-127, 128, (4, 40, 16)).astype(np.int8)
    A = rng.integers(-127, 128, (4, 40, 16)).astype(np.int8)
    pi = 2  # a 16 x 16 block weight
    for e, limit in (([-30, -29, -30, -31], 2.0**49), ([-25, -25, -25, -25], 2.0**49), ([-30, -29, -30, -31], 2.0**20)):
        want = np.zeros(eng.layout.size, np.int64)
        dW = np.stack([G[i].astype(np.float64).T @ A[i] for i in range(4)])
        eng._accumulate(want, pi, dW, np.array(e), 40, limit)
        got = np.zeros(eng.layout.size, np.int64)
        folded = OPS.fold_grad(eng, got, pi, G, A, np.array(e), 40, limit)
        assert folded == (limit > 2.0**40)
        if folded:
            assert got.tobytes() == want.tobytes()


def test_compiled_output_error_is_the_numpy_routes(text):
    """The sequence output error (row keys, stochastic rounding, zero-sum in one compiled pass)
    against the numpy rules (sround.quantize_errors, zero_sum_errors): uniform logits (every
    row trimmed: 95 classes of ~1.3 units each), one sharp row per sample, random logits,
    and ties between the largest entries of a trimmed row."""
    spec = model_for(text, ("block16h2",))
    fast, ref = (Trainer(spec, Hyper(seed=2), text, load_luts()).engine for _ in range(2))
    ref.attn_ops = None
    tr = Trainer(spec, Hyper(seed=2), text, load_luts())
    x, y = tr.inputs(0, range(3))
    n, b, T = x.shape
    C = spec.classes
    rng = np.random.default_rng(9)
    zs = [np.zeros((n, b * T, C)), rng.normal(0, 4, (n, b * T, C)), rng.normal(0, 0.3, (n, b * T, C))]
    zs[0][1, ::3, 5] = 9.0
    zs[2][:, :, :4] = 1.5  # tied largest entries
    trimmed = 0
    for z in zs:
        got, want = fast.top_errors(z, x, y), ref.top_errors(z, x, y)
        assert got[0].dtype == np.int8
        _same(got[0].astype(np.float64), want[0])
        _same(got[1], want[1])
        _same(got[2], want[2])
        _same(got[3], want[3])
        assert (want[0].sum(axis=-1) == 0).all()
        trimmed += int((want[0] == -127).sum())
    assert trimmed > b * T  # the trim ran (rows whose others summed over 127)


def test_compiled_accumulate_and_weight_quantize_are_the_numpy_rules(text):
    """Engine._accumulate on the compiled route (one loop) against the numpy rule, the clamp at
    the limit included, and the weights' int8 values and exponents (one loop) against
    quant_exponent and quantize."""
    from daisychain.engine.detmath import quant_exponent, quantize

    fast = Trainer(model_for(text, ("block16h2",)), Hyper(seed=1), text, load_luts()).engine
    ref = Trainer(model_for(text, ("block16h2",)), Hyper(seed=1), text, load_luts()).engine
    ref.attn_ops = None
    rng = np.random.default_rng(11)
    pi = fast.first_param[2] + 9  # the fc1 bias
    size = fast.layout.shapes[pi][0]
    for limit in (2.0**62, 3000.0):
        for ints in (rng.integers(-2**20, 2**20, (3, size)), rng.integers(-127, 128, (3, size)).astype(np.float64)):
            want = np.zeros(fast.layout.size, np.int64)
            got = np.zeros(fast.layout.size, np.int64)
            e = np.array([-30, -12, -41])
            ref._accumulate(want, pi, ints, e, 20, limit)
            fast._accumulate(got, pi, ints, e, 20, limit)
            assert want.any() and want.tobytes() == got.tobytes()
    for W in (rng.normal(0, 0.1, (16, 24)), np.zeros((4, 4)), rng.normal(0, 1e-30, (5,)) , np.array([0.5, -0.25, 127.4])):
        Wq, ew = OPS._wq(W)
        assert ew == int(quant_exponent(np.abs(W).max()))
        _same(Wq.astype(np.float64), quantize(W, ew))


def test_one_float64_division_floored_is_the_integer_division():
    """The softmax's and the norm's rounded divisions floor one float64 division (no reciprocal,
    no correction): exact for integers 0 <= p < 2**53, d >= 1 (a quotient that is not an
    integer lies at least 1/d below the next one; the rounding error is below p * 2**-53 /
    d). At and beside the multiples of d, up to the bound."""
    rng = np.random.default_rng(5)
    for d in [1, 2, 3, 7, 254, 2**16 + 1, 2**21 - 1, 2**31 - 1, 2**40 + 3, 2**52 - 1]:
        qs = np.concatenate([np.arange(4), rng.integers(0, (2**53 - 1) // d, 300)])
        p = np.array(sorted({int(q * d + r) for q in qs for r in (-1, 0, 1, d - 1) if 0 <= q * d + r < 2**53}))
        assert np.array_equal(np.floor(p.astype(np.float64) / float(d)).astype(np.int64), p // d), d
    bias = np.concatenate([rng.normal(0, 1, 30), [0.0, -0.5, 2.0**-20, 3e5, -3e5]])
    for sexp in (np.array([-20, -3, 4]), np.array([-40, 0, -14])):  # -40: the clamp at 2**30
        want = np.clip(np.floor(bias[None, :] * np.ldexp(1.0, -sexp)[:, None] + 0.5), -2.0**30, 2.0**30)
        _same(OPS._bacc(bias, sexp), want)

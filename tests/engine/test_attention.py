"""The transformer (issue 37; docs/ENGINE.md "The transformer"): the integer rules, the
layer kinds, its gradient against torch's float gradient, split invariance, the literal
table engine, the unit counters and the one-line refusals. A tiny model: width 16, 2 heads,
context 8 (the text task's default windows)."""

from __future__ import annotations

import numpy as np
import pytest

from daisychain.engine import norm as N
from daisychain.engine.attention import attn_shift, softmax_back, softmax_int
from daisychain.engine.counters import unit_counts_per_micro_batch
from daisychain.engine.data import model_for, prepare_task
from daisychain.engine.model import Engine, init_params, seq_targets
from daisychain.engine.spec import Hyper, ModelSpec, SpecError, gpt, layers_text
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts

TINY = ("block16h2",)


@pytest.fixture(scope="module")
def text():
    return prepare_task("text")


def _trainer(text, items=TINY, **hp):
    return Trainer(model_for(text, items), Hyper(seed=3, **hp), text, load_luts())


# ---------------------------------------------------------------- the integer rules

def test_rshift_sdiv_isqrt_against_python_integers():
    rng = np.random.default_rng(1)
    v = rng.integers(-2**40, 2**40, 5000)
    k = rng.integers(0, 30, 5000)
    want = [(int(a) + (1 << (int(s) - 1))) >> int(s) if s else int(a) for a, s in zip(v, k)]
    assert N.rshift(v, k).tolist() == want
    m = rng.integers(1, 2**31, 5000)
    got = N.sdiv(v, m)
    for a, mm, g in zip(v.tolist(), m.tolist(), got.tolist()):
        q = (2 * abs(a) + mm) // (2 * mm)
        assert g == (q if a >= 0 else -q)
    import math
    s = np.concatenate([rng.integers(0, 2**53, 3000), [0, 1, 2, 3, 4, 2**52, 2**53 - 1],
                        np.arange(1, 2000) ** 2, np.arange(1, 2000) ** 2 - 1])
    assert N.isqrt(s).tolist() == [math.isqrt(int(x)) for x in s]
    big = np.array([(2**26 + 3) ** 2 - 1, (2**26 + 3) ** 2, 94906265 ** 2 - 1])  # sqrt rounds up
    assert N.isqrt(big).tolist() == [math.isqrt(int(x)) for x in big]


def test_align_add_keeps_the_larger_exponent_and_ignores_a_zero_operand():
    A = np.array([[[1000.0, -2000.0]]])
    B = np.array([[[3.0, 5.0]]])
    V, e = N.align_add([(A, np.array([0])), (B, np.array([4]))])  # B is 48, 80 in A's units
    assert e.tolist() == [0] and V.tolist() == [[[1048.0, -1920.0]]]
    V, e = N.align_add([(np.zeros((1, 1, 2)), np.array([90])), (B, np.array([4]))])
    assert e.tolist() == [4] and V.tolist() == [[[3.0, 5.0]]]
    W = np.array([[[40000.0, 1.0]]])  # wide: at most 2**15 after the add
    V, e = N.align_add([(W, np.array([0])), (W, np.array([0]))])
    assert np.abs(V).max() <= 2**15 and e.tolist() == [2]


def test_rmsnorm_forward_and_backward_follow_the_float_norm():
    rng = np.random.default_rng(2)
    x = rng.integers(-30000, 30000, (1, 6, 16)).astype(np.int64)
    x[0, 1] //= 1000  # a small row: its own scale j
    x[0, 2] = 0  # a zero row
    y, cache = N.rms_forward(x)
    xf = x.astype(np.float64)
    rms = np.sqrt((xf ** 2).mean(-1, keepdims=True))
    want = np.divide(xf, rms, out=np.zeros_like(xf), where=rms > 0) * 2**N.NORM_F
    assert np.abs(y - want).max() <= 2  # isqrt and rounding
    assert not y[0, 2].any()
    g = rng.integers(-127, 128, (1, 6, 16))
    dx, e = N.rms_backward(g, np.array([-3]), np.array([-5]), cache)
    yh = want / 2**N.NORM_F
    gf = g * 2.0**-3
    ref = (gf - yh * (yh * gf).mean(-1, keepdims=True)) / np.where(rms > 0, rms * 2.0**-5, 1)
    ref[0, 2] = 0
    got = dx * 2.0 ** e[0]
    live = [0, 1, 3, 4, 5]
    assert np.allclose(got[0, live], ref[0, live], rtol=0, atol=2e-3 * np.abs(ref).max())
    assert not got[0, 2].any()


def test_integer_softmax_is_causal_and_sums_near_128():
    eng = Engine(gpt(10, 8, TINY), load_luts())
    rng = np.random.default_rng(3)
    Sc = rng.integers(-3000, 3000, (2, 3, 8, 8)).astype(np.float64)
    P = softmax_int(eng, Sc, np.array([-8, -7]))
    assert P.min() >= 0 and P.max() <= 127
    assert not np.triu(P, 1).any()  # nothing above the diagonal
    assert (P[..., 0, 0] == 127).all()  # one allowed position: 128 saturates to 127
    s = P.sum(-1)
    assert (np.abs(s - 128) <= 8).all()
    # against the float softmax of the same scaled scores
    T = 8
    z = Sc * np.array([2.0**-8, 2.0**-7])[:, None, None, None]
    z = np.where(np.tri(T, dtype=bool), z, -np.inf)
    pf = np.exp(z - z.max(-1, keepdims=True))
    pf /= pf.sum(-1, keepdims=True)
    assert np.abs(P / 128 - pf).max() < 0.03
    dP = rng.integers(-2**20, 2**20, P.shape).astype(np.float64)
    dA = softmax_back(P, dP)
    assert not np.triu(dA, 1).any() and np.abs(dA).max() < 2**53
    assert attn_shift(16) == 2 and attn_shift(8) == 1 and attn_shift(64) == 3


# ---------------------------------------------------------------- the model

def test_spec_round_trip_and_layers_text(text):
    spec = model_for(text, ("block16h2", "block16h4"))
    assert [l.type for l in spec.layers] == ["embedding", "posembed", "block", "block", "rmsnorm", "linear"]
    assert ModelSpec.from_json(spec.to_json()) == spec and spec.seq and spec.uses_exp
    assert layers_text(spec) == "block16h2,block16h4"
    names = spec.param_shapes()
    assert names[2] == ("layers.2.q.weight", (16, 16)) and ("layers.2.fc2.weight", (16, 64)) in names


@pytest.mark.parametrize("items, words", [
    (("block30h4",), "width 30 is not divisible by 4 heads"),
    (("block16h2", "block32h2"), "one width"),
    (("block16h2", 64), "blockWhH items only"),
    (("block4h1",), "width must lie in [8, 1024]"),
])
def test_bad_blocks_are_refused_in_one_line(text, items, words):
    with pytest.raises(SpecError) as exc:
        model_for(text, items)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_blocks_need_a_text(text):
    from daisychain.engine.data import load_digits
    with pytest.raises(SpecError, match="transformer blocks read a text"):
        model_for(load_digits(), TINY)


def test_too_many_attention_scores_is_refused(text):
    with pytest.raises(SpecError, match="attention scores a micro-batch"):
        Trainer(gpt(text.classes, 256, ("block64h64",)), Hyper(micro_batch=64, batch=64), text, load_luts())


def test_gradient_agrees_with_torch_float_gradient(text):
    import torch
    from daisychain.engine.floatref import float_model

    tr = _trainer(text, ("block16h2", "block16h2"))
    for _ in range(5):
        tr.apply(tr.contribute(range(4)).grad)
    g = tr.mean_grad(tr.contribute(range(4)).grad)
    x, y = tr.inputs(tr.state.step, range(4))
    m = float_model(tr.spec, tr.theta).double()
    out = m(torch.tensor(x.reshape(-1, 8)))
    torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                      torch.tensor(seq_targets(x, y).reshape(-1))).backward()
    off = 0
    for name, p in m.named_parameters():
        a, b = g[off:off + p.numel()], p.grad.numpy().ravel()
        off += p.numel()
        if name.endswith("k.bias"):  # softmax ignores a per-row constant: its true gradient is 0
            assert np.abs(b).max() < 1e-12
            continue
        cos = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
        assert cos > 0.97, (name, cos)
        assert 0.8 < np.linalg.norm(a) / np.linalg.norm(b) < 1.25, name


def test_split_invariance_and_the_literal_table_engine(text):
    hp = dict(batch=8, micro_batch=2)
    a, b, c = _trainer(text, **hp), _trainer(text, **hp), Trainer(model_for(text, TINY), Hyper(seed=3, **hp), text,
                                                                   load_luts(), gemm="lut")
    for step in range(2):
        whole = a.contribute(range(4)).grad
        parts = b.contribute([0, 2]).grad + b.contribute([3]).grad + b.contribute([1]).grad
        lut = c.contribute(range(4)).grad
        assert np.array_equal(whole, parts) and np.array_equal(whole, lut)
        for t in (a, b, c):
            t.apply(whole)
    assert a.params_sha256() == b.params_sha256() == c.params_sha256()


def test_it_learns_and_reports_test_loss(text):
    tr = _trainer(text)
    first = tr.test_loss()
    for _ in range(40):
        tr.apply(tr.contribute(range(tr.hp.n_micro)).grad)
    assert tr.test_loss() < first - 0.5
    assert np.isclose(first, np.log(text.classes), atol=0.6)


def test_identity_names_the_exp_table_only_for_a_transformer(text):
    luts = load_luts()
    tr = _trainer(text)
    assert tr.identity["exp_lut"] == luts.exp_sha256
    assert "exp_lut" not in Trainer(model_for(text, 32), Hyper(), text, luts).identity


def test_unit_counts_match_the_table_engine(text):
    """The formula (counters.py, Block.units, exp_units) equals what gemm="lut" computes."""
    spec = model_for(text, TINY)
    eng = Engine(spec, load_luts(), gemm="lut")
    seen = {"multiply": 0, "requantize": 0, "relu": 0, "exp": 0}
    mm, rq, relu = eng._mm, eng._requantize, eng._relu

    def count_mm(a, w):
        seen["multiply"] += int(a.shape[0] * a.shape[1] * a.shape[2] * w.shape[-1])
        return mm(a, w)

    def count_rq(acc, s):
        seen["requantize"] += int(np.asarray(acc).size)
        return rq(acc, s)

    def count_relu(q):
        seen["relu"] += int(q.size)
        return relu(q)

    class Exp:  # counts the exp table reads of the causal positions
        def __getitem__(self, idx):
            seen["exp"] += int(np.asarray(idx).size)
            return eng_exp[idx]

    eng_exp = eng.exp_t
    eng._mm, eng._requantize, eng._relu, eng.exp_t = count_mm, count_rq, count_relu, Exp()
    rng = np.random.default_rng(0)
    b = 3
    x = rng.integers(0, text.classes, (1, b, 8))
    eng.grad(init_params(spec, 1), x, rng.integers(0, text.classes, (1, b)), 40, 2.0**51)
    want = unit_counts_per_micro_batch(spec, b)
    T, H = 8, 2
    seen["exp"] = seen["exp"] * (T + 1) // (2 * T)  # the engine gathers T*T and masks: count the causal half
    assert seen == want


def test_golden_attention_rules_file_is_current():
    from daisychain.engine.golden_attention import PATH, build, dumps
    assert PATH.read_text() == dumps(build()), "run `python -m daisychain.engine.golden_attention`"


def test_test_loss_for_every_task(text):
    """train --json's test_loss: the char window's only logits, digits' logits, both near
    log(classes) at the start; a transformer's last position (above)."""
    from daisychain.engine.data import load_digits

    d = load_digits()
    for ds, spec in ((d, model_for(d, 16)), (text, model_for(text, 32))):
        tr = Trainer(spec, Hyper(), ds, load_luts())
        assert abs(tr.test_loss() - np.log(ds.classes)) < 0.7

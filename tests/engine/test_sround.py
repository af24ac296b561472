"""Unit tier (numpy and node): the transformer's output error rounded stochastically (issue 37,
engine/sround.py and its JS twin webui/engine/sround.js). The keys and the int8 errors are
the same bytes in both languages, a sample's key does not depend on where it sits in the
batch, and the rounding is unbiased where round-half-up sent the small probabilities to 0."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from jsrun import run_js

from daisychain.engine import sround
from daisychain.engine.detmath import quant_exponent, zero_sum_errors
from daisychain.engine.model import Engine
from daisychain.engine.spec import gpt
from daisychain.units import load_luts

JS = r"""
const out = [];
for (const c of DATA) {
  const keys = R.rowKeys(Int32Array.from(c.x), Int32Array.from(c.y), c.b, c.T);
  const dz = Float64Array.from(c.dz);
  const q = R.quantizeStochastic(dz, c.e, keys, c.b * c.T, c.C);
  const top = M.topErrors(dz, Int32Array.from(c.labels), c.b * c.T, c.C, keys);
  out.push({ keys: Array.from(keys), q: Array.from(q), G: Array.from(top.G), eg: top.eg });
}
console.log(JSON.stringify(out));
"""


def _sha(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, "<i8").tobytes()).hexdigest()


def _case(rng, b, T, C, scale):
    x = rng.integers(0, C, (1, b, T))
    y = rng.integers(0, C, (1, b))
    z = rng.normal(0, scale, (1, b * T, C))
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    labels = np.concatenate([x[..., 1:], y[..., None]], -1).reshape(1, -1)
    dz = p / (b * T)
    dz[0, np.arange(b * T), labels[0]] -= 1.0 / (b * T)
    return x, y, labels, dz


def test_keys_and_errors_are_the_same_bytes_in_python_and_js():
    rng = np.random.default_rng(37)
    cases, want = [], []
    for b, T, C, scale in ((4, 8, 45, 3.0), (3, 5, 7, 0.1), (2, 16, 300, 8.0), (1, 1, 2, 1.0)):
        x, y, labels, dz = _case(rng, b, T, C, scale)
        if C == 7:  # ids at the top of the range, and values on the grid (v + u on an integer)
            x[0, 0, :] = 2**16 - 1
            dz[0, :2] = np.round(dz[0, :2] * 2**20) / 2**20
        keys = sround.row_keys(x, y)
        e = quant_exponent(np.abs(dz).max())
        q = sround.quantize_stochastic(dz, np.array([e]), keys)
        G, eg = sround.quantize_errors(dz, keys)
        G = zero_sum_errors(G, labels)
        assert int(eg[0]) == int(e)
        want.append((keys, q, G, int(e)))
        cases.append({"x": x.ravel().tolist(), "y": y.ravel().tolist(), "labels": labels.ravel().tolist(),
                      "dz": dz.ravel().tolist(), "b": b, "T": T, "C": C, "e": int(e)})
    got = run_js(JS, {"R": "engine/sround.js", "M": "engine/model.js"}, data=cases)
    for (keys, q, G, e), have in zip(want, got):
        assert have["keys"] == keys.ravel().astype(np.int64).tolist()
        assert _sha(have["q"]) == _sha(q.ravel()), "quantizeStochastic differs from quantize_stochastic"
        assert _sha(have["G"]) == _sha(G.ravel()) and have["eg"] == e


def test_a_samples_key_does_not_depend_on_its_place_in_the_batch():
    """The same samples split otherwise (another micro-batch, another order) draw the same u:
    what makes --workers, peers and threads agree."""
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 95, (2, 6, 8)), rng.integers(0, 95, (2, 6))
    keys = sround.row_keys(x, y).reshape(12, 8)
    perm = rng.permutation(12)
    moved = sround.row_keys(x.reshape(12, 8)[perm].reshape(3, 4, 8), y.reshape(12)[perm].reshape(3, 4))
    assert np.array_equal(moved.reshape(12, 8), keys[perm])
    assert len(np.unique(keys)) == keys.size  # rows and samples draw apart


def test_the_rounding_is_unbiased_where_half_up_gives_zero():
    """A value of 0.3 units rounds to 0 by floor(v + 1/2) every time; floor(v + u) gives 1 for
    ~30% of the entries, so its mean is the value."""
    rng = np.random.default_rng(2)
    x, y = rng.integers(0, 95, (1, 512, 4)), rng.integers(0, 95, (1, 512))
    keys = sround.row_keys(x, y)
    dz = np.full((1, keys.shape[1], 95), 0.3 * 2.0**-10)
    q = sround.quantize_stochastic(dz, np.array([-10]), keys)
    assert set(np.unique(q)) == {0.0, 1.0}
    assert abs(q.mean() - 0.3) < 0.01


@pytest.mark.parametrize("compiled", [True, False])
def test_the_transformers_output_error_keeps_the_small_probabilities(compiled):
    """Issue 37: with one int8 scale per micro-batch of 8 x 16 rows, round-half-up sent every
    probability below half a unit to 0, on every step (their mass came back only through the
    zero-sum step, onto the target): the engine lagged its float twin. Rounded
    stochastically, those entries keep their total (within 10%), on both routes alike."""
    spec = gpt(45, 16, ("block16h2",))
    eng = Engine(spec, load_luts())
    if not compiled:
        eng.attn_ops = None
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 45, (1, 8, 16)), rng.integers(0, 45, (1, 8))
    z = rng.normal(0, 1.0, (1, 8 * 16, 45))
    z[0, np.arange(128), rng.integers(0, 45, 128)] += 6.0  # one likely class a row: the rest small
    G, eg, _, _ = eng.top_errors(z, x, y)
    labels = np.concatenate([x[..., 1:], y[..., None]], -1).reshape(-1)
    p = np.exp(z[0] - z[0].max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    small = p / 128 * 2.0 ** -int(eg[0]) < 0.5  # half-up rounds these to 0
    small[np.arange(len(labels)), labels] = False
    assert small.sum() > 2000
    got = G[0][small].sum() * 2.0 ** int(eg[0])
    assert abs(got / (p[small].sum() / 128) - 1.0) < 0.1
    if compiled:
        eng.attn_ops = None
        G2, eg2, _, _ = eng.top_errors(z, x, y)
        assert np.array_equal(G, G2) and np.array_equal(eg, eg2)


def test_only_a_sequence_models_identity_names_the_rounding():
    """An engine that rounds the transformer's output error half up computes other bits: the
    run id tells them apart; every other model's identity (and run id) is unchanged."""
    from daisychain.engine.data import model_for, prepare_task
    from daisychain.engine.spec import Hyper
    from daisychain.engine.trainer import run_identity

    text, luts = prepare_task("text"), load_luts()
    assert run_identity(model_for(text, ("block16h2",)), Hyper(), text, luts)["output_rounding"] == "stochastic"
    assert "output_rounding" not in run_identity(model_for(text, 32), Hyper(), text, luts)

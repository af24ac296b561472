"""Unit tier (numpy and node): the transformer's output error rounded stochastically (issue 37,
engine/sround.py and its JS twin webui/engine/sround.js). The keys and the int8 errors are
the same bytes in both languages, a sample's key does not depend on where it sits in the
batch, and the rounding is unbiased where round-half-up sent the small probabilities to 0."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from jsrun import LOAD_LUTS, run_js

from daisychain import package_path
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


# ---------------------------------------------------------------------- the backward's errors
JS_ERR = "const lutDir = process.argv[2];\n" + LOAD_LUTS + r"""
const units = new U.CpuUnits(luts);
const out = [];
for (const c of DATA) {
  const r = await R.requantizeErrors(units, Float64Array.from(c.v), c.e, Uint32Array.from(c.skeys), R.siteKey(c.li, c.j));
  out.push({ q: Array.from(r.q), e: r.e, site: R.siteKey(c.li, c.j),
             h: Array.from(R.sampleKeys(Int32Array.from(c.x), Int32Array.from(c.y), c.b, c.T)) });
}
console.log(JSON.stringify(out));
"""


def _err_cases(rng):
    """(V (1, b*P, C), mask or None): every shift regime (0, ordinary, above 32), values on the
    grid (V + r on a multiple of 2**sh) and both clamp ends."""
    out = []
    for b, P, C, scale, masked in ((3, 4, 16, 3.0, False), (2, 8, 32, 2e4, True), (4, 5, 7, 2.0**45, False),
                                   (2, 3, 5, 1e9, False), (1, 1, 1, 1e3, False)):
        V = np.floor(rng.normal(0, scale, (1, b * P, C)))
        if C == 32:
            V[0, 0, :4] = [2**15 - 1, -(2**15 - 1), 2**14, -(2**14)]  # the clamp ends, the grid
        out.append((V, rng.integers(-2, 3, V.shape).astype(np.int8) if masked else None))
    return out


UNITS = [Engine(gpt(45, 16, ("block16h2",)), load_luts(), gemm=g)._requantize for g in ("fast", "lut")]


def test_error_requantize_is_the_same_bytes_in_numpy_compiled_and_js():
    """requantize_errors (numpy rule and compiled loop) and requantizeErrors give the same int8
    errors, shift and site keys; the sample keys are the output error's. (JS gets the masked
    case with its mask applied: the block's JS backward zeroes those entries first.)"""
    rng = np.random.default_rng(44)
    want, cases = [], []
    for i, (V, mask) in enumerate(_err_cases(rng)):
        b = {3 * 4: 3, 2 * 8: 2, 4 * 5: 4, 2 * 3: 2, 1: 1}[V.shape[1]]
        T = 6
        x, y = rng.integers(0, 2**16, (1, b, T)), rng.integers(0, 2**16, (1, b))
        sk = sround.sample_keys(x, y)
        li, j = i + 1, (5 * i) % 13
        site = sround.site_key(li, j)
        q, e, S = sround.requantize_errors(V, np.array([-3 + i]), sk, site, mask, sums=True)
        qc, ec, Sc = sround.requantize_errors(V.astype(np.float32) if abs(V).max() < 2**24 else V, np.array([-3 + i]),
                                              sk, site, mask, sums=True, compiled=True, dtype=np.int8)
        assert np.array_equal(q, qc) and np.array_equal(e, ec) and np.array_equal(S, Sc)
        for unit in UNITS:  # the requantize unit of V + r - 2**sh / 2: the reference route's
            qu, eu, Su = sround.requantize_errors(V, np.array([-3 + i]), sk, site, mask, sums=True, unit=unit)
            assert np.array_equal(q, qu) and np.array_equal(e, eu) and np.array_equal(S, Su)
        assert np.array_equal(S[0], q[0].sum(axis=0)) and np.abs(q).max() <= 127
        Vj = V if mask is None else np.where(mask > 0, V, 0)
        want.append((q, int(e[0]), site, sk))
        cases.append({"v": Vj.ravel().tolist(), "e": -3 + i, "skeys": sk[0].tolist(), "li": li, "j": j,
                      "x": x.ravel().tolist(), "y": y.ravel().tolist(), "b": b, "T": T})
    shifts = [int(w[1]) - (-3 + i) for i, w in enumerate(want)]
    assert 0 in shifts and any(0 < v <= 32 for v in shifts) and max(shifts) > 32  # the three regimes
    got = run_js(JS_ERR, {"R": "engine/sround.js", "U": "engine/cpu_units.js"}, data=cases,
                 args=[str(package_path("luts"))])
    for (q, e, site, sk), have in zip(want, got):
        assert _sha(have["q"]) == _sha(q.ravel()) and have["e"] == e
        assert have["site"] == site and have["h"] == sk[0].tolist()


def test_an_error_samples_rounding_does_not_depend_on_its_place():
    """The offsets are keyed by the sample's tokens, the site and the element, not by where the
    sample sits: the same samples in another order or another micro-batch (of the same shift)
    get the same int8 errors. What makes --workers, peers and tabs agree."""
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 95, (2, 4, 8)), rng.integers(0, 95, (2, 4))
    V = np.floor(rng.normal(0, 3000, (2, 4, 8, 16)))
    V[..., 0, 0] = 2**14  # every sample holds the max: one shift for any grouping
    site = sround.site_key(3, 5)
    q, e, _ = sround.requantize_errors(V.reshape(2, 32, 16), 0, sround.sample_keys(x, y), site)
    perm = rng.permutation(8)
    xm, ym, Vm = x.reshape(8, 8)[perm], y.reshape(8)[perm], V.reshape(8, 8, 16)[perm]
    qm, em, _ = sround.requantize_errors(Vm.reshape(4, 16, 16), 0, sround.sample_keys(xm.reshape(4, 2, 8),
                                         ym.reshape(4, 2)), site)
    assert np.array_equal(qm.reshape(8, 8, 16), q.reshape(8, 8, 16)[perm]) and len(set(e) | set(em)) == 1
    other, _, _ = sround.requantize_errors(V.reshape(2, 32, 16), 0, sround.sample_keys(x, y), sround.site_key(3, 6))
    assert not np.array_equal(other, q)  # another site draws apart


def test_the_error_rounding_is_unbiased_where_half_up_is_not():
    """Errors of +-0.3 and 0.7 units (one big entry sets the shift): floor((V + 2**sh/2) / 2**sh)
    gives 0, 0 and 1 every time; the stochastic rule's means are the values."""
    rng = np.random.default_rng(6)
    x, y = rng.integers(0, 95, (1, 256, 8)), rng.integers(0, 95, (1, 256))
    sh = 10
    V = np.zeros((1, 256 * 8, 64))
    V[0, :, 0:21], V[0, :, 21:42], V[0, :, 42:63] = 0.3 * 2**sh, -0.3 * 2**sh, 0.7 * 2**sh
    V = np.floor(V)
    V[0, 0, 63] = 100 * 2**sh  # the shift: bitlen(102400) - 7 = 10
    for compiled in (False, True):
        q, e, _ = sround.requantize_errors(V, 0, sround.sample_keys(x, y), sround.site_key(2, 0),
                                           compiled=compiled)
        assert int(e[0]) == sh
        for cols, v in ((slice(0, 21), 0.3), (slice(21, 42), -0.3), (slice(42, 63), 0.7)):
            mean = q[0, :, cols].astype(np.float64).mean()
            assert abs(mean - np.floor(v * 2**sh) / 2**sh) < 0.01, (v, mean)


def test_workers_give_trains_hash_with_the_errors_rounded_stochastically():
    """A transformer's run: 3 simulated workers end on train's hash (every worker draws each
    sample's offsets from its tokens), and the identity names the rounding."""
    import json
    import subprocess
    import sys

    base = [sys.executable, "-m", "daisychain.cli", "train", "--task", "text", "--context", "8", "--layers",
            "block16h2,block16h2", "--steps", "3", "--json"]
    runs = [json.loads(subprocess.run(base + extra, capture_output=True, text=True, timeout=600,
                                      check=True).stdout.splitlines()[-1]) for extra in ([], ["--workers", "3"])]
    assert runs[0]["params_sha256"] == runs[1]["params_sha256"]
    assert runs[0]["identity"]["error_rounding"] == "stochastic"

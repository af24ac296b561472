"""The numpy engine: split invariance, golden vectors, gradient quality, accuracy, data."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from daisychain.engine import golden, prng
from daisychain.engine.adam import AdamState, adam_step
from daisychain.engine.cli import train
from daisychain.engine.data import DataError, Dataset, load_text, prepare_task
from daisychain.engine.detmath import EXP_COEFFS, dexp, quant_exponent, quantize
from daisychain.engine.floatref import float_model
from daisychain.engine.model import Engine, init_params
from daisychain.engine.settings import RunSettings
from daisychain.engine.spec import Hyper, ModelSpec, SpecError, mlp
from daisychain.engine.trainer import Trainer, assign, capacity_split, identity_differences
from daisychain.engine.data import model_for
from daisychain.units import load_luts


@pytest.fixture(scope="module")
def digits():
    return prepare_task("digits")


@pytest.fixture(scope="module")
def text():
    return prepare_task("text")


def _settings(ds, steps, hidden=32, **hp):
    return RunSettings(ds, model_for(ds, hidden), Hyper(**hp), steps)


@pytest.mark.parametrize("task", ["digits", "text"])
def test_split_invariance_any_workers_and_assignment(task, digits, text):
    ds = digits if task == "digits" else text
    rs = _settings(ds, 20, seed=3)
    ref = train(rs, 1, quiet=True)["params_sha256"]
    for workers, how in [(2, "random"), (3, "capacity"), (4, "random"), (5, "capacity"),
                         (3, "round-robin")]:
        got = train(rs, workers, how, quiet=True)["params_sha256"]
        assert got == ref, f"{task}: {workers} workers / {how} diverged"


def test_literal_table_gemm_gives_the_same_hash(digits):
    rs = _settings(digits, 3, hidden=16)
    assert train(rs, gemm="lut", quiet=True)["params_sha256"] == \
        train(rs, gemm="fast", quiet=True)["params_sha256"]


def test_a_micro_batch_contribution_depends_only_on_its_samples(digits):
    rs = _settings(digits, 0)
    tr = Trainer(rs.spec, rs.hp, digits, load_luts())
    alone = [tr.contribute([j]).grad for j in range(rs.hp.n_micro)]
    together = tr.contribute(list(range(rs.hp.n_micro))).grad
    assert np.array_equal(sum(alone), together)
    assert np.array_equal(tr.contribute([2, 0]).grad, alone[0] + alone[2])


def test_hash_changes_with_seed_and_settings(digits):
    a = train(_settings(digits, 5, seed=1), quiet=True)["params_sha256"]
    b = train(_settings(digits, 5, seed=2), quiet=True)["params_sha256"]
    c = train(_settings(digits, 5, seed=1, lr=1e-3), quiet=True)["params_sha256"]
    assert len({a, b, c}) == 3


def test_golden_step_files_are_current():
    for name, text_ in golden.files().items():
        assert (golden.DIR / name).read_text() == text_, f"run `python -m daisychain.engine.golden` ({name})"


def test_int8_gradient_is_a_real_gradient(digits):
    """Cosine similarity with the float gradient of the same parameters > 0.9."""
    rng = np.random.default_rng(0)
    spec = mlp(64, 64, 10)
    theta = init_params(spec, 11)
    eng = Engine(spec, load_luts())
    x = rng.uniform(0, 16, (4, 16, 64))
    y = rng.integers(0, 10, (4, 16))
    S, n = 40, 4
    g_int = eng.grad(theta, x, y, S, 2.0**49).grad.astype(np.float64) * 2.0**-S / n
    model = float_model(spec, theta)
    model.double()
    xt = torch.tensor(x.reshape(-1, 64))
    loss = torch.nn.functional.cross_entropy(model(xt), torch.tensor(y.reshape(-1)))
    loss.backward()
    g_f = np.concatenate([p.grad.numpy().ravel() for p in model.parameters()])
    cos = g_int @ g_f / np.linalg.norm(g_int) / np.linalg.norm(g_f)
    assert cos > 0.9, cos
    params = list(model.parameters())
    for i, p in enumerate(params):  # per tensor too
        o = sum(q.numel() for q in params[:i])
        gi, gf = g_int[o:o + p.numel()], p.grad.numpy().ravel()
        assert gi @ gf / np.linalg.norm(gi) / np.linalg.norm(gf) > 0.85


def test_default_settings_reach_97_percent_and_match_float(digits):
    """Defaults of `daisychain train`: >= 97% on digits; --float within 1 point."""
    from daisychain.engine.floatref import train_float
    from daisychain.engine.settings import DEFAULT_STEPS

    rs = RunSettings(digits, model_for(digits, 128), Hyper(), DEFAULT_STEPS)
    assert DEFAULT_STEPS <= 1000
    int8 = train(rs, quiet=True)["accuracy"]
    flt = train_float(rs, quiet=True)["accuracy"]
    assert int8 >= 0.97, int8
    assert abs(int8 - flt) <= 0.01, (int8, flt)


def test_cli_json_and_params_line():
    out = subprocess.run([sys.executable, "-m", "daisychain.cli", "train", "--steps", "4",
                          "--hidden", "16", "--json"], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert len(data["params_sha256"]) == 64 and data["steps"] == 4
    out2 = subprocess.run([sys.executable, "-m", "daisychain.cli", "train", "--steps", "4",
                           "--hidden", "16", "--workers", "3", "--assign", "random", "--quiet"],
                          capture_output=True, text=True, check=True)
    assert f"params-sha256: {data['params_sha256']}" in out2.stdout


@pytest.mark.parametrize("args,msg", [
    (["--task", "nope"], "unknown task 'nope'"),
    (["--batch", "60", "--micro-batch", "16"], "multiple of --micro-batch"),
    (["--seed", "-1"], "--seed must be"),
    (["--task", "text", "--data", "/nonexistent/corpus.txt"], "the file does not exist"),
    (["--hidden", "0"], "--hidden must be"),
])
def test_bad_settings_get_a_clear_message(args, msg):
    out = subprocess.run([sys.executable, "-m", "daisychain.cli", "train", "--steps", "1", *args],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert msg in out.stderr and "Traceback" not in out.stderr


def test_local_text_csv_and_bad_column(tmp_path):
    txt = tmp_path / "corpus.txt"
    txt.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    ds = load_text(str(txt), context=4)
    assert ds.classes == len(set(txt.read_text().replace("\n", "\n")))
    assert ds.fingerprint == load_text(str(txt), context=4).fingerprint
    csv = tmp_path / "rows.csv"
    csv.write_text("id,body\n" + "".join(f"{i},hello world number {i}\n" for i in range(30)))
    assert load_text(str(csv), column="body", context=4).x_train.shape[1] == 4
    with pytest.raises(DataError, match=r"no column 'text'; its columns are \['id', 'body'\]"):
        load_text(str(csv), column="text")
    with pytest.raises(DataError, match="holds"):
        load_text(str(csv), column="id")
    bad = tmp_path / "x.bin"
    bad.write_bytes(b"\0\1")
    with pytest.raises(DataError, match="unknown file type"):
        load_text(str(bad))


def test_unknown_hub_dataset_is_a_clear_error():
    with pytest.raises(DataError, match="never downloads|not found|could not load"):
        load_text("no-such-user/no-such-dataset-xyz")


def test_dataset_bytes_roundtrip_and_corruption(digits):
    again = Dataset.from_bytes(digits.to_bytes())
    assert again.fingerprint == digits.fingerprint
    with pytest.raises(DataError):
        Dataset.from_bytes(b"XXXX" + digits.to_bytes()[4:])
    with pytest.raises(DataError):
        Dataset.from_bytes(digits.to_bytes()[:-8])


def test_deterministic_exp_and_quantize():
    x = -np.linspace(0, 80, 20001)
    assert np.max(np.abs(dexp(x) / np.exp(x) - 1)) < 1e-13
    assert all(c == 1 / __import__("math").factorial(i) for i, c in enumerate(EXP_COEFFS))
    v = np.array([0.0, 1.0, -3.7, 100.0])
    e = int(quant_exponent(np.abs(v).max()))
    q = quantize(v, e)
    assert 64 <= np.abs(q).max() < 128 and e == 0
    assert quantize(np.array([0.5, -0.5, 1.5]), 0).tolist() == [1.0, 0.0, 2.0]  # half up


def test_prng_and_permutation():
    assert prng.u32(0, 0, 4).tolist() == prng.u32(0, 0, 2).tolist() + prng.u32(0, 0, 2, start=2).tolist()
    p = prng.permutation(9, 1, 1000)
    assert sorted(p.tolist()) == list(range(1000)) and p.tolist() != list(range(1000))
    with pytest.raises(ValueError):
        prng.u32(-1, 0, 1)


def test_adam_bias_correction_is_a_running_product():
    theta = np.zeros(3)
    st = AdamState.zeros(3)
    hp = Hyper()
    for _ in range(5):
        adam_step(theta, st, np.array([1.0, -2.0, 0.0]), hp)
    b = 1.0
    for _ in range(5):
        b = b * 0.9
    assert st.b1t == b and st.step == 5
    assert theta[2] == 0.0 and theta[0] < 0 < theta[1]


def test_spec_validation_and_roundtrip():
    spec = mlp(64, 32, 10)
    assert ModelSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    with pytest.raises(SpecError, match="expects 64 inputs"):
        ModelSpec.from_json({"input": {"kind": "dense", "dim": 63}, "classes": 10,
                             "layers": [{"type": "linear", "in": 64, "out": 10}]})
    with pytest.raises(SpecError, match="unknown layer type"):
        ModelSpec.from_json({"input": {"kind": "dense", "dim": 4}, "classes": 2,
                             "layers": [{"type": "conv"}]})
    with pytest.raises(SpecError, match="overflow"):
        mlp(70000, 4, 2)


def test_identity_differences_name_what_differs(digits):
    tr = Trainer(model_for(digits, 16), Hyper(), digits, load_luts())
    other = dict(tr.identity, luts="f" * 64, engine="999")
    diffs = identity_differences(tr.identity, other)
    assert any("LUT manifest" in d for d in diffs) and any("engine version" in d for d in diffs)


@pytest.mark.usefixtures("node")
def test_identity_differences_say_the_same_in_js():
    """webui/run/member.js names every identity field that trainer.py names, in the same words
    (the exp table and the output error's rounding were missing there)."""
    from jsrun import run_js

    mine = {k: "a" for k in ("model", "hyper", "dataset", "luts", "engine", "seed", "task", "exp_lut",
                              "output_rounding", "error_rounding")}
    theirs = dict({k: "b" for k in mine}, model={"layers": []})
    got = run_js("const [a, b] = DATA; console.log(JSON.stringify(M.identityDifferences(a, b)));",
                 imports={"M": "run/member.js"}, data=[mine, theirs])
    assert got == identity_differences(mine, theirs) and len(got) == len(mine)


def test_capacity_assignment_is_proportional():
    parts = capacity_split(list(range(12)), [1, 2, 3])
    assert [len(p) for p in parts] == [2, 4, 6]
    assert sorted(sum(assign(7, 3, "random", 0, 0), [])) == list(range(7))


def test_engine_requantize_routing_equals_the_unit():
    """The engine routes accumulators on floats; it must equal units.requantize bit for bit."""
    from daisychain.units import requantize

    eng = Engine(mlp(4, 4, 2), load_luts())
    rng = np.random.default_rng(3)
    for s in range(32):
        acc = np.concatenate([rng.integers(-2**31, 2**31, 3000),
                              rng.integers(-(1 << min(s + 9, 31)), 1 << min(s + 9, 31), 3000),
                              [2**31 - 1, -2**31, 0, 1, -1]])
        got = eng._requantize(acc.astype(np.float64)[None], np.array([s]))[0]
        assert np.array_equal(got, requantize(acc, s).astype(np.float64)), s

"""The mean squared error loss, exact in every engine: the numpy reference pass, the dense
fast path and the JS engine (webui/engine/model.js mseOutputError) give the same bits, held
together by tests/data/mse_cases.json (output errors and a short run's hash after every
step). Regenerate the file with ``python tests/engine/test_mse.py`` after a deliberate change.
Unit tier, and node for the JS twin."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from daisychain import package_path
from daisychain.engine.detmath import mse_output_error
from daisychain.engine.spec import Hyper
from daisychain.engine.trainer import Trainer
from daisychain.task import arrays_dataset
from daisychain.units import load_luts
from jsrun import LOAD_LUTS, run_js

CASES = Path(__file__).resolve().parents[1] / "data" / "mse_cases.json"
STEPS = 6
HYPER = {"lr": 0.01, "batch": 16, "micro_batch": 4, "seed": 5}


def table() -> tuple:
    """A small regression table with two targets, from the integer PRNG-free formula (the
    same floats everywhere): x in a grid, y two fixed functions of it."""
    i = np.arange(60, dtype=np.float64)
    x = np.stack([(i % 7) / 3.0 - 1.0, (i % 5) * 0.25, np.floor(i / 10.0) - 2.5], axis=1)
    y = np.stack([x[:, 0] * 2.0 - x[:, 1] + 0.5, x[:, 2] * x[:, 0] * 0.25], axis=1)
    return x[:48], y[:48], x[48:], y[48:]


def run_hashes(gemm: str = "fast") -> tuple[list[str], Trainer]:
    from daisychain.engine.data import model_for

    ds = arrays_dataset(table(), "mse", "mse-table")
    spec = model_for(ds, (8, 8))
    tr = Trainer(spec, Hyper(**HYPER), ds, load_luts(), gemm)
    out = []
    for _ in range(STEPS):
        tr.apply(tr.contribute(range(tr.n_tasks)).grad)
        out.append(tr.params_sha256())
    return out, tr


def error_cases() -> list[dict]:
    rng = np.random.default_rng(11)
    cases = []
    for b, k in ((1, 1), (4, 2), (5, 3)):
        z = rng.normal(size=(1, b, k)) * 3.0
        y = rng.normal(size=(1, b, k))
        dz, _, _ = mse_output_error(z, y)
        cases.append({"b": b, "z": z.ravel().tolist(), "y": y.ravel().tolist(),
                      "dz": dz.ravel().tolist()})
    return cases


def make_cases() -> dict:
    shas, tr = run_hashes()
    return {"errors": error_cases(), "hyper": HYPER, "layers": [8, 8], "steps": STEPS,
            "fingerprint": tr.ds.fingerprint, "model": tr.spec.to_json(), "shas": shas}


def test_python_holds_to_the_shared_cases():
    want = json.loads(CASES.read_text())
    assert make_cases() == want


def test_reference_pass_and_fast_path_agree():
    """The literal layer-by-layer pass (the LUT GEMM) and the dense fast path: one hash."""
    fast, tr = run_hashes("fast")
    assert tr.engine.fast is not None  # the dense fast path ran
    lut, _ = run_hashes("lut")
    assert fast == lut


def test_mse_spec_keeps_cross_entropy_run_ids():
    """The loss joins the spec's JSON only when it is not cross-entropy: every run before
    the mse loss keeps its identity."""
    from daisychain.engine.data import load_digits, model_for
    from daisychain.engine.spec import ModelSpec

    spec = model_for(load_digits(), 32)
    assert "loss" not in spec.to_json() and spec.loss == "cross_entropy"
    _, tr = run_hashes()
    assert tr.spec.to_json()["loss"] == "mse"
    assert ModelSpec.from_json(tr.spec.to_json()) == tr.spec
    with pytest.raises(Exception, match="the loss must be one of"):
        ModelSpec.from_json({**tr.spec.to_json(), "loss": "hinge"})


def test_mse_learns_the_table():
    """Not only exact: the test error falls well below the targets' own spread."""
    from daisychain.engine.data import model_for

    ds = arrays_dataset(table(), "mse", "mse-table")
    tr = Trainer(model_for(ds, (16,)), Hyper(**{**HYPER, "lr": 0.02}), ds, load_luts())
    before = tr.mse()
    for _ in range(300):
        tr.apply(tr.contribute(range(tr.n_tasks)).grad)
    assert tr.mse() < 0.25 * before


DRIVER = r"""
const [lutDir, dataPath] = process.argv.slice(2);
""" + LOAD_LUTS + r"""
const job = DATA;
const errors = job.errors.map((c) => Array.from(M.mseOutputError(Float64Array.from(c.z), Float64Array.from(c.y), c.b).dz));
const ds = D.parseDataset(readFileSync(dataPath));
ds.fingerprint = job.fingerprint;
const spec = S.modelFor(ds, job.layers);
const hyper = S.makeHyper(job.hyper);
const tr = new T.Trainer({ spec, hyper, dataset: ds, luts, units: new P.CpuUnits(luts) });
const shas = [];
for (let s = 0; s < job.steps; s++) {
  const c = await tr.contribute([...Array(hyper.batch / hyper.micro_batch).keys()]);
  tr.apply(c.grad);
  shas.push(await tr.paramsSha256());
}
console.log(JSON.stringify({ errors, shas, model: spec.toJson() }));
"""


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_js_engine_holds_to_the_shared_cases(tmp_path):
    want = json.loads(CASES.read_text())
    data = tmp_path / "table.dcds"
    data.write_bytes(arrays_dataset(table(), "mse", "mse-table").to_bytes())
    got = run_js(DRIVER, imports={"D": "engine/data.js", "S": "engine/spec.js", "T": "engine/trainer.js",
                                  "P": "engine/cpu_units.js", "M": "engine/model.js"},
                 data=want, args=[str(package_path("luts")), str(data)], timeout=300)
    assert got["errors"] == [c["dz"] for c in want["errors"]]
    assert got["model"] == want["model"]
    assert got["shas"] == want["shas"]


if __name__ == "__main__":
    CASES.write_text(json.dumps(make_cases(), indent=1) + "\n")
    print(f"wrote {CASES}", file=sys.stderr)

"""The transformer (issue 37) has everything a model has: the --float twin, checkpoints and
resume (train's hash), export to .safetensors and .onnx (onnxruntime) and torch_model whose
predictions follow the INT8 engine's, and `daisychain sample`. Tiny: width 16, 2 heads,
context 8."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import daisychain
from daisychain.engine.checkpoint import write_checkpoint_file
from daisychain.engine.data import model_for, prepare_task
from daisychain.engine.spec import Hyper
from daisychain.engine.trainer import Trainer
from daisychain.export import export
from daisychain.units import load_luts

ITEMS = ("block16h2",)
MIN_AGREEMENT = 0.85  # the float twin is not the integer engine: argmax agreement on the test split


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    ds = prepare_task("text")
    tr = Trainer(model_for(ds, ITEMS), Hyper(seed=5), ds, load_luts())
    for _ in range(60):
        tr.apply(tr.contribute(range(tr.hp.n_micro)).grad)
    path = tmp_path_factory.mktemp("gpt") / "run.pt"
    write_checkpoint_file(path, tr.identity, tr.state.step, tr.theta, tr.state.adam, ds.meta["vocab"])
    return path, ds, tr, tr.engine.predict(tr.theta, ds.x_test, tr.hp.micro_batch)


def _cli(*args, cwd=None):
    out = subprocess.run([sys.executable, "-m", "daisychain.cli", *args], capture_output=True,
                         text=True, timeout=300, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return out


def test_torch_model_and_onnx_follow_the_engine(trained, tmp_path):
    path, ds, tr, engine_pred = trained
    model = daisychain.torch_model(path)
    agree = float((model.predict(ds.x_test) == engine_pred).mean())
    assert agree >= MIN_AGREEMENT, agree
    export(path, tmp_path / "m.onnx")
    import onnxruntime as ort

    s = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    logits = s.run(["logits"], {"x": ds.x_test.astype(np.int64)})[0]
    assert logits.shape == (len(ds.x_test), ds.classes)
    assert float((logits.argmax(1) == engine_pred).mean()) >= MIN_AGREEMENT
    export(path, tmp_path / "m.safetensors")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "m.safetensors"), framework="np") as f:
        keys = set(f.keys())
    assert {"layers.2.q.weight.int8", "layers.2.fc2.bias", "layers.1.weight"} <= keys
    back = daisychain.torch_model(tmp_path / "m.safetensors")
    assert np.array_equal(back.predict(ds.x_test), model.predict(ds.x_test))


def test_resume_gives_train_hash_and_float_twin_runs(tmp_path):
    base = ["train", "--task", "text", "--layers", "block16h2", "--json"]
    full = json.loads(_cli(*base, "--steps", "6").stdout.splitlines()[-1])
    _cli(*base, "--steps", "3", "--save-checkpoint", str(tmp_path / "a.pt"))
    res = json.loads(_cli(*base, "--steps", "6", "--resume", str(tmp_path / "a.pt")).stdout.splitlines()[-1])
    assert res["params_sha256"] == full["params_sha256"] and res["start_step"] == 3
    assert full["test_loss"] > 0 and full["identity"]["exp_lut"] == load_luts().exp_sha256
    fl = json.loads(_cli(*base, "--steps", "6", "--float").stdout.splitlines()[-1])
    assert fl["float"] and abs(fl["test_loss"] - full["test_loss"]) < 0.3


def test_workers_give_train_hash():
    base = ["train", "--task", "text", "--layers", "block16h2,block16h2", "--steps", "3", "--json"]
    hashes = {json.loads(_cli(*base, *extra).stdout.splitlines()[-1])["params_sha256"]
              for extra in ([], ["--workers", "3"], ["--workers", "4", "--assign", "random"])}
    assert len(hashes) == 1


def test_sample_reads_the_last_position(trained):
    path, ds, tr, _ = trained
    out = _cli("sample", str(path), "--length", "40", "--temperature", "0", "--prompt", "Beautiful")
    assert out.stdout.startswith("Beautiful") and len(out.stdout.strip()) >= 49
    from daisychain.sample import generate
    text = generate(tr.engine, tr.theta, tr.spec, ds.meta["vocab"], "Beautiful", 5, 0.0, 0)
    x = np.array([[ds.meta["vocab"].index(c) for c in "Beautiful"[-8:]]], np.int32)
    first = ds.meta["vocab"][int(tr.engine.predict(tr.theta, x, 1)[0])]
    assert text[0] == first


@pytest.mark.parametrize("args, words", [
    (["--layers", "block30h4"], "width 30 is not divisible by 4 heads"),
    (["--layers", "block16h2", "--context", "256", "--micro-batch", "2048", "--batch", "2048"],
     "attention scores a micro-batch"),
    (["--layers", "block16h2", "--task", "digits"], "transformer blocks read a text"),
])
def test_bad_settings_one_line_before_anything_starts(args, words, tmp_path):
    base = ["train", "--task", "text", "--steps", "2", "--save-checkpoint", str(tmp_path / "x.pt")]
    if "--task" in args:
        base = base[:1] + base[3:]
    out = subprocess.run([sys.executable, "-m", "daisychain.cli", *base, *args], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode != 0 and words in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2  # argparse's usage line, then the one line
    assert not (tmp_path / "x.pt").exists()


def test_local_steps_split_gives_one_hash():
    base = ["train", "--task", "text", "--layers", "block16h2", "--steps", "2", "--replicas", "2",
            "--sync-every", "2", "--json"]
    hashes = {json.loads(_cli(*base, *extra).stdout.splitlines()[-1])["params_sha256"]
              for extra in ([], ["--workers", "3"])}
    assert len(hashes) == 1

"""`daisychain export` and `daisychain.torch_model`: a trained checkpoint as .safetensors
(float32 + the exact int8 weights with their scales), as .onnx run in onnxruntime, and as a
torch.nn.Module whose predictions agree with the INT8 engine's; bad files are refused in
words and nothing is written."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import daisychain
from daisychain.engine.checkpoint import write_checkpoint_file
from daisychain.engine.data import model_for, prepare_task
from daisychain.engine.detmath import quant_exponent, quantize
from daisychain.engine.spec import Hyper
from daisychain.engine.trainer import Trainer
from daisychain.export import ExportError, export, torch_model
from daisychain.units import load_luts

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MIN_AGREEMENT = 0.99


def _train(task, hidden, steps, path):
    ds = prepare_task(task)
    tr = Trainer(model_for(ds, hidden), Hyper(seed=5), ds, load_luts())
    for _ in range(steps):
        tr.apply(tr.contribute(range(tr.hp.n_micro)).grad)
    write_checkpoint_file(path, tr.identity, tr.state.step, tr.theta, tr.state.adam)
    engine_pred = tr.engine.predict(tr.theta, ds.x_test, tr.hp.micro_batch)
    return path, ds, tr, engine_pred


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return _train("digits", 128, 150, tmp_path_factory.mktemp("ex") / "run.pt")


def _agreement(pred, engine_pred, what):
    agree = float((np.asarray(pred) == engine_pred).mean())
    print(f"{what}: argmax agreement with the INT8 engine {agree * 100:.2f}% "
          f"of {len(engine_pred)} test samples")
    assert agree >= MIN_AGREEMENT, f"{what}: {agree:.4f}"
    return agree


def _onnx_pred(path, ds):
    import onnxruntime as ort

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = ds.x_test.astype(np.float32 if ds.kind == "dense" else np.int64)
    return s.run(["logits"], {"x": x})[0].argmax(axis=1)


def test_safetensors_holds_float32_and_exact_int8_with_scales(digits, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    ck, ds, tr, _ = digits
    out = tmp_path / "model.safetensors"
    r = subprocess.run([str(BIN / "daisychain"), "export", str(ck), "--to", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert tr.params_sha256() in r.stdout
    t = load_file(str(out))
    names = [n for n, _ in tr.spec.param_shapes()]
    assert set(t) == set(names) | {f"{n}.{k}" for n in names if n.endswith("weight")
                                   for k in ("int8", "scale")}
    for name, w in zip(names, tr.layout.views(tr.theta)):
        assert t[name].dtype == torch.float32 and tuple(t[name].shape) == w.shape
        if name.endswith("bias"):
            assert torch.equal(t[name], torch.from_numpy(w.astype(np.float32)))
            continue
        e = int(quant_exponent(np.abs(w).max()))  # the engine's own quantization
        assert t[f"{name}.int8"].dtype == torch.int8
        assert np.array_equal(t[f"{name}.int8"].numpy(), quantize(w, e).astype(np.int8))
        assert float(t[f"{name}.scale"]) == 2.0 ** e
        assert torch.equal(t[name], t[f"{name}.int8"].float() * t[f"{name}.scale"])
    with safe_open(str(out), framework="pt") as f:
        meta = f.metadata()
    assert meta["format"] == "daisychain-export" and meta["step"] == "150"
    assert json.loads(meta["model"]) == tr.spec.to_json()
    assert json.loads(meta["identity"])["hyper"] == tr.hp.to_json()
    assert meta["params_sha256"] == tr.params_sha256() and meta["run_id"] == tr.run_id
    # torch_model reads the export too, to the same module as from the .pt
    a, b = torch_model(out).state_dict(), torch_model(ck).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_torch_model_and_onnx_agree_with_the_int8_engine(digits, tmp_path):
    ck, ds, tr, engine_pred = digits
    model = daisychain.torch_model(ck)
    assert isinstance(model, torch.nn.Module) and not model.training
    _agreement(model.predict(ds.x_test), engine_pred, "torch_model (int8 weights), digits")
    _agreement(torch_model(ck, "master").predict(ds.x_test), engine_pred,
               "torch_model (master weights), digits")
    assert model.predict(ds.x_test[0]) == int(model.predict(ds.x_test[:1])[0])
    out = tmp_path / "model.onnx"
    export(ck, out)
    _agreement(_onnx_pred(out, ds), engine_pred, "onnxruntime, digits")
    import onnx

    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert props["params_sha256"] == tr.params_sha256()
    assert json.loads(props["model"]) == tr.spec.to_json()


def test_multi_layer_and_text_models_export(tmp_path):
    for task, hidden in (("digits", (64, 32)), ("text", 64)):
        ck, ds, tr, engine_pred = _train(task, hidden, 120, tmp_path / f"{task}.pt")
        model = torch_model(ck)
        assert len([m for m in model.layers if isinstance(m, torch.nn.Linear)]) == \
            (3 if task == "digits" else 2)
        _agreement(model.predict(ds.x_test), engine_pred, f"torch_model, {task} {hidden}")
        export(ck, tmp_path / f"{task}.onnx")
        _agreement(_onnx_pred(tmp_path / f"{task}.onnx", ds), engine_pred,
                   f"onnxruntime, {task} {hidden}")
        export(ck, tmp_path / f"{task}.safetensors")
        if task == "text":
            from safetensors import safe_open

            with safe_open(str(tmp_path / "text.safetensors"), framework="np") as f:
                assert f.metadata()["vocab"] == ds.meta["vocab"]
            with pytest.raises(ValueError, match="token ids"):
                model.predict(np.full((1, ds.x_test.shape[1]), ds.classes))


def _malicious_pt(marker: Path) -> bytes:
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    buf = io.BytesIO()
    torch.save({"format": "daisychain-checkpoint", "x": Evil()}, buf)
    return buf.getvalue()


def _deflated(data: bytes) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(data))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for i in src.infolist():
            z.writestr(i.filename, src.read(i.filename))
    return buf.getvalue()


@pytest.mark.parametrize("case", ["garbage", "truncated", "malicious", "compressed",
                                  "pickle", "missing"])
def test_bad_checkpoint_is_refused_and_nothing_is_written(digits, tmp_path, case, capsys):
    ck = digits[0]
    good = ck.read_bytes()
    marker = tmp_path / "pwned"
    bad = tmp_path / "bad.pt"
    data = {"garbage": b"\x00not a checkpoint" * 10, "truncated": good[: len(good) // 2],
            "malicious": _malicious_pt(marker), "compressed": _deflated(good),
            "pickle": pickle.dumps({"format": "daisychain-checkpoint"})}.get(case)
    if data is not None:
        bad.write_bytes(data)
    from daisychain.cli import main

    for suffix in (".safetensors", ".onnx"):
        out = tmp_path / f"model{suffix}"
        if case == "malicious" and suffix == ".onnx":  # once through the installed command
            r = subprocess.run([str(BIN / "daisychain"), "export", str(bad), "--to", str(out)],
                               capture_output=True, text=True, timeout=120)
            rc, err = r.returncode, r.stderr
        else:  # the same command line, in this process
            rc = main(["export", str(bad), "--to", str(out)])
            err = capsys.readouterr().err
        assert rc == 1, err
        assert "daisychain export: error:" in err and "Traceback" not in err
        assert not out.exists() and not marker.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == (["bad.pt"] if data else [])
        if case == "malicious":
            assert "not a loadable checkpoint" in err


def test_bad_output_and_bad_safetensors_are_refused(digits, tmp_path):
    ck = digits[0]
    with pytest.raises(ExportError, match="must end in"):
        export(ck, tmp_path / "model.bin")
    same = tmp_path / "same.onnx"
    same.write_bytes(ck.read_bytes())
    with pytest.raises(ExportError, match="checkpoint itself"):
        export(same, same)
    same.unlink()
    with pytest.raises(ExportError, match="cannot write"):
        export(ck, tmp_path / "no" / "such" / "model.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(ExportError, match="not a readable DaisyChain export"):
        torch_model(bad)
    from safetensors.numpy import save_file

    save_file({"layers.0.weight": np.zeros((2, 2), np.float32)}, str(bad))
    with pytest.raises(ExportError, match="not a DaisyChain export"):
        torch_model(bad)
    for model in ("[" * 100_000 + "]" * 100_000, '{"layers": 7}', "not json"):
        save_file({"layers.0.weight": np.zeros((2, 2), np.float32)}, str(bad),
                  metadata={"format": "daisychain-export", "model": model})
        with pytest.raises(ExportError, match="not a readable DaisyChain export"):
            torch_model(bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.safetensors"]


def test_checkpoints_doc_snippet_runs(digits, tmp_path):
    """The five-line usage example of docs/CHECKPOINTS.md, run as written on a real run.pt."""
    text = (ROOT / "docs" / "CHECKPOINTS.md").read_text()
    m = re.search(r"<!-- snippet: torch_model.*?-->\n```python\n(.*?)```", text, re.S)
    assert m, "the torch_model snippet is missing from docs/CHECKPOINTS.md"
    code = m.group(1)
    assert len(code.strip().splitlines()) == 5
    (tmp_path / "run.pt").write_bytes(digits[0].read_bytes())
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    printed = re.search(r"\[([\d\s]+)\]", r.stdout)
    assert printed, r.stdout
    want = torch_model(digits[0]).predict(digits[1].x_test[:10])
    assert [int(v) for v in printed.group(1).split()] == list(want)
    assert "torch.Size([2, 10])" in r.stdout

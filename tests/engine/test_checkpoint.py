"""Checkpoints: torch.load reads them; bad or malicious files are refused, nothing executes."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch

from daisychain.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from daisychain.engine.data import model_for, prepare_task
from daisychain.engine.spec import Hyper
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts


@pytest.fixture(scope="module")
def trained():
    ds = prepare_task("digits")
    tr = Trainer(model_for(ds, 16), Hyper(seed=4), ds, load_luts())
    for _ in range(5):
        tr.apply(tr.contribute(range(tr.hp.n_micro)).grad)
    return tr


def _save(tr):
    return save_checkpoint(tr.identity, tr.state.step, tr.theta, tr.state.adam)


def test_roundtrip_and_torch_loads_it(trained, tmp_path):
    data = _save(trained)
    path = tmp_path / "run.pt"
    path.write_bytes(data)
    obj = torch.load(path, weights_only=True)
    assert obj["params_sha256"] == trained.params_sha256()
    model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))
    model.double()
    sd = {k.replace("layers.", ""): v for k, v in obj["state_dict"].items()}
    model.load_state_dict(sd)  # names and shapes are torch's own
    ck = load_checkpoint(data, trained.identity)
    assert ck.params_sha256 == trained.params_sha256() and ck.step == 5
    assert np.array_equal(ck.adam.m, trained.state.adam.m) and ck.adam.b2t == trained.state.adam.b2t


def test_resumed_training_matches_uninterrupted(trained):
    ck = load_checkpoint(_save(trained), trained.identity)
    ds = trained.ds
    a = Trainer(trained.spec, trained.hp, ds, load_luts())
    a.state.theta[:] = ck.theta
    a.state.adam, a.state.step = ck.adam, ck.step
    b = Trainer(trained.spec, trained.hp, ds, load_luts())
    for t in (b,):
        for _ in range(7):
            t.apply(t.contribute(range(t.hp.n_micro)).grad)
    for _ in range(2):
        a.apply(a.contribute(range(a.hp.n_micro)).grad)
    assert a.params_sha256() == b.params_sha256()


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


@pytest.mark.parametrize("mutate,msg", [
    (lambda o: o.__setitem__("format", "other"), "not a DaisyChain checkpoint"),
    (lambda o: o["state_dict"].pop("layers.0.bias"), "missing \\['layers.0.bias'\\]"),
    (lambda o: o["state_dict"].__setitem__("layers.0.bias", torch.zeros(3, dtype=torch.float64)),
     "has shape \\(3,\\)"),
    (lambda o: o["state_dict"].__setitem__("layers.0.bias", torch.zeros(16)), "must be torch.float64"),
    (lambda o: o["state_dict"]["layers.2.weight"].__setitem__((0, 0), float("nan")), "non-finite"),
    (lambda o: o["state_dict"]["layers.2.weight"].__setitem__((0, 0), 1.5), "hash mismatch"),
    (lambda o: o.__setitem__("identity", dict(o["identity"], luts="0" * 64)), "LUT manifest"),
    (lambda o: o["adam"].__setitem__("step", 99), "inconsistent"),
])
def test_bad_checkpoints_are_refused(trained, mutate, msg):
    obj = torch.load(io.BytesIO(_save(trained)), weights_only=True)
    mutate(obj)
    buf = io.BytesIO()
    torch.save(obj, buf)
    with pytest.raises(CheckpointError, match=msg):
        load_checkpoint(buf.getvalue(), trained.identity)


def test_malicious_pickle_never_executes(trained, capsys):
    buf = io.BytesIO()
    torch.save({"format": "daisychain-checkpoint", "x": Evil()}, buf)
    with pytest.raises(CheckpointError, match="weights-only"):
        load_checkpoint(buf.getvalue(), trained.identity)
    assert "pwned" not in capsys.readouterr().out
    try:
        load_checkpoint(buf.getvalue(), trained.identity)
    except CheckpointError as exc:  # never passes on torch's advice to disable the check
        assert "weights_only" not in str(exc) and "objects other than tensors" in str(exc)
    with pytest.raises(CheckpointError, match="weights-only"):
        load_checkpoint(pickle.dumps(Evil()), trained.identity)
    assert "pwned" not in capsys.readouterr().out


def test_garbage_and_truncated_files(trained):
    data = _save(trained)
    for bad in (b"", b"hello", data[: len(data) // 2], bytes(200)):
        with pytest.raises(CheckpointError):
            load_checkpoint(bad, trained.identity)

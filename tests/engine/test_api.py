"""The Python API (daisychain/api.py) gives the bits of the command line: the same hash as
``daisychain train`` for digits, text and image; save / resume / export / predict; a bad
value gets the command line's own one-line reason (the same SETTINGS table). Unit tier
(no sockets)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import daisychain as dc
from daisychain.cli import main as cli_main


def cli_json(capsys, *argv) -> dict:
    assert cli_main(["train", *argv, "--json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("data, model, flags, settings", [
    ("digits", dc.Model([dc.Dense(32), 16]), ["--layers", "32,16", "--steps", "6", "--seed", "3"],
     {"steps": 6, "seed": 3}),
    ("text", dc.Model("24", embed_dim=8, context=6),
     ["--task", "text", "--layers", "24", "--embed-dim", "8", "--context", "6", "--steps", "5",
      "--lr", "0.01"], {"steps": 5, "lr": 0.01}),
    ("image", dc.Model([dc.Conv(4), dc.Pool(), dc.Dense(16)]),
     ["--task", "image", "--layers", "conv4,pool,16", "--steps", "2", "--batch", "32"],
     {"steps": 2, "batch": 32}),
])
def test_api_train_is_the_command_lines_hash(capsys, data, model, flags, settings):
    want = cli_json(capsys, *flags)
    got = dc.train(model, data, **settings)
    assert got.params_sha256 == want["params_sha256"]
    assert got.run_id == want["run_id"] and got.accuracy == want["accuracy"]


def test_api_local_steps_and_workers_are_the_command_lines_hash(capsys):
    want = cli_json(capsys, "--layers", "16", "--steps", "3", "--replicas", "2", "--sync-every", "2")
    got = dc.train("16", "digits", steps=3, replicas=2, sync_every=2, workers=3)
    assert got.params_sha256 == want["params_sha256"]


def test_api_save_resume_export_predict(tmp_path):
    full = dc.train("16", "digits", steps=8, seed=2)
    half = dc.train("16", "digits", steps=4, seed=2, save=str(tmp_path / "half.pt"))
    assert half.params_sha256 != full.params_sha256
    resumed = dc.resume(tmp_path / "half.pt", steps=8)
    assert resumed.params_sha256 == full.params_sha256
    assert dc.resume(tmp_path / "half.pt").params_sha256 == half.params_sha256  # no steps: as saved
    full.save(tmp_path / "full.pt")
    import torch

    obj = torch.load(tmp_path / "full.pt", weights_only=True)
    assert obj["params_sha256"] == full.params_sha256
    info = full.export(tmp_path / "full.safetensors")
    assert info["params_sha256"] == full.params_sha256 and (tmp_path / "full.safetensors").stat().st_size
    from sklearn.datasets import load_digits

    x = load_digits().data[:20]
    pred = full.predict(x)
    assert pred.shape == (20,) and pred.dtype.kind == "i"
    model = dc.torch_model(tmp_path / "full.safetensors")
    # the export computes in float (docs/CHECKPOINTS.md): it agrees with the engine on most rows
    assert (model.predict(x) == pred).mean() >= 0.9
    assert set(full.evaluate()) == {"accuracy"} and full.evaluate()["accuracy"] == full.accuracy


@pytest.mark.parametrize("kwargs, flags", [
    ({"lr": 5.0}, ["--lr", "5"]),
    ({"steps": 0}, ["--steps", "0"]),
    ({"batch": 10, "micro_batch": 16}, ["--batch", "10"]),
    ({"seed": -1}, ["--seed", "-1"]),
    ({"replicas": 0}, ["--replicas", "0"]),
])
def test_api_bad_value_gets_the_command_lines_reason(capsys, kwargs, flags):
    """One line, and the same reason as the flag (the one SETTINGS table), names as in Python."""
    with pytest.raises(dc.SettingsError) as err:
        dc.train(None, "digits", **kwargs)
    msg = str(err.value)
    assert "\n" not in msg and "--" not in msg
    try:
        assert cli_main(["train", *flags]) == 2  # refused after parsing
    except SystemExit as exc:  # refused by the flag's type
        assert exc.code == 2
    cli = capsys.readouterr().err.strip()
    assert "\n" not in cli
    from daisychain.api import _words

    assert msg.split(", not")[0] in _words(cli), (msg, cli)


@pytest.mark.parametrize("call, words", [
    (lambda: dc.train(None, "digits", bogus=1), "unknown setting bogus="),
    (lambda: dc.Model("12,abc"), "layers takes comma-separated"),
    (lambda: dc.train(None, 42), "data must be digits, text, image"),
    (lambda: dc.train(None, "no/such-local-set.txt", steps=1), "no/such-local-set.txt"),
    (lambda: dc.train(None, (np.zeros((4, 2, 2)), np.zeros(4), np.zeros((2, 2)), np.zeros(2))),
     "x_train must be (rows, features)"),
    (lambda: dc.train(None, (np.zeros((4, 2)), np.zeros(3), np.zeros((2, 2)), np.zeros(2))),
     "y_train has 3 rows, x_train 4"),
    (lambda: dc.train(None, (np.zeros((4, 2)), np.zeros(4), np.zeros((2, 3)), np.zeros(2))),
     "x_test has 3 features, x_train 2"),
    (lambda: dc.train(None, (np.zeros((4, 2)), np.array([0, 1, 2, np.nan]), np.zeros((2, 2)),
                             np.zeros(2))), "not finite"),
])
def test_api_bad_input_one_line(call, words):
    with pytest.raises(dc.SettingsError) as err:
        call()
    assert words in str(err.value) and "\n" not in str(err.value)


def test_resume_refuses_other_data(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3))
    y = x.sum(axis=1)
    dc.train("8", (x[:48], y[:48], x[48:], y[48:]), steps=2, batch=16, micro_batch=4,
             save=str(tmp_path / "r.pt"))
    with pytest.raises(dc.SettingsError, match="give its data"):
        dc.resume(tmp_path / "r.pt", steps=3)
    with pytest.raises(dc.SettingsError, match="fingerprint"):
        dc.resume(tmp_path / "r.pt", (x[:48], y[:48] + 1, x[48:], y[48:]), steps=3)


def test_a_regression_model_predicts_numbers_and_exports_them(tmp_path):
    """An mse model's predict gives its outputs (not a class), in the engine and in the export."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 4))
    y = np.stack([x[:, 0] - 0.5 * x[:, 1], x[:, 2] * 0.3], axis=1)
    r = dc.train("16", (x[:160], y[:160], x[160:], y[160:]), steps=150, lr=0.01, batch=32, micro_batch=8)
    assert r.metrics["identity"]["model"]["loss"] == "mse" and r.accuracy == 0.0
    pred = r.predict(x[160:])
    assert pred.shape == (40, 2) and pred.dtype == np.float64
    assert r.test_mse == pytest.approx(float(np.mean((pred - y[160:]) ** 2)))
    assert r.test_mse < 0.5 * float(np.mean(y[160:] ** 2))  # it learned something
    r.export(tmp_path / "reg.safetensors")
    exported = dc.torch_model(tmp_path / "reg.safetensors").predict(x[160:])
    assert exported.shape == (40, 2) and np.abs(exported - pred).max() < 0.1

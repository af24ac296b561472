"""Model depth and widths as a run setting (``--layers 256,256``): the flag on every command
that takes run settings, the spec it makes for both tasks, the run identity, split
invariance and the literal-table GEMM on a 2-hidden-layer model, and the same spec from the
JS side (node)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from daisychain.engine.checkpoint import run_flags
from daisychain.engine.cli import train
from daisychain.engine.data import prepare_task
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.spec import SpecError, hidden_of
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts
from jsrun import run_js


def _settings(*argv):
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return settings_from_args(p.parse_args(list(argv)))


@pytest.mark.parametrize("task", ["digits", "text"])
def test_layers_makes_the_hidden_stack_for_both_tasks(task):
    rs = _settings("--task", task, "--layers", "256,64")
    linears = [l for l in rs.spec.layers if l.type == "linear"]
    assert [l.n_out for l in linears[:-1]] == [256, 64] == hidden_of(rs.spec)
    assert linears[-1].n_out == rs.ds.classes
    assert [l.type for l in rs.spec.layers][-5:] == ["linear", "relu", "linear", "relu", "linear"]
    if task == "text":
        assert rs.spec.layers[0].type == "embedding"


def test_one_width_is_the_default_run_and_layers_changes_the_run_id():
    luts = load_luts()
    ids = {}
    for name, argv in {"default": (), "hidden": ("--hidden", "128"), "layers1": ("--layers", "128"),
                       "layers2": ("--layers", "128,128")}.items():
        rs = _settings(*argv)
        ids[name] = Trainer(rs.spec, rs.hp, rs.ds, luts).run_id
    assert ids["default"] == ids["hidden"] == ids["layers1"]
    assert ids["layers2"] != ids["default"]


@pytest.mark.parametrize("argv, words", [
    (("--layers", "64", "--hidden", "32"), "give --layers or --hidden, not both"),
])
def test_layers_and_hidden_together_are_refused(argv, words):
    with pytest.raises(SpecError, match=words):
        _settings(*argv)


@pytest.mark.parametrize("text, words", [
    ("64,x", "comma-separated hidden widths"), ("", "comma-separated hidden widths"),
    ("64,0", "hidden widths must be >= 1"), (",".join(["8"] * 17), "at most 16 hidden layers"),
    ("70000", "cannot overflow"),
])
def test_bad_layers_text_is_a_usage_error(text, words):
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", "train", "--layers", text, "--steps", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert words in r.stderr, r.stderr


@pytest.mark.parametrize("task", ["digits", "text"])
def test_two_hidden_layers_split_invariance_and_table_gemm(task):
    rs = _settings("--task", task, "--layers", "24,16", "--seed", "3", "--steps", "6")
    ref = train(rs, 1, quiet=True)
    for workers, how in [(3, "random"), (2, "capacity")]:
        assert train(rs, workers, how, quiet=True)["params_sha256"] == ref["params_sha256"]
    rs.steps = 2
    assert train(rs, gemm="lut", quiet=True)["params_sha256"] == train(rs, quiet=True)["params_sha256"]


@pytest.mark.parametrize("cmd", [["daisychain.cli", "train"], ["daisychain.peer.cli"]])
def test_every_run_command_takes_layers(cmd):
    r = subprocess.run([sys.executable, "-m", *cmd, "--help"], capture_output=True, text=True, check=True)
    assert "--layers" in r.stdout


def test_train_json_reports_the_stack():
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", "train", "--layers", "20,12", "--steps", "2",
                        "--json"], capture_output=True, text=True, check=True)
    out = json.loads(r.stdout)
    widths = [l["out"] for l in out["identity"]["model"]["layers"] if l["type"] == "linear"]
    assert widths == [20, 12, 10]


def test_checkpoint_hint_names_the_layers():
    rs = _settings("--layers", "48,24", "--seed", "5")
    tr = Trainer(rs.spec, rs.hp, rs.ds, load_luts())
    flags = run_flags(tr.identity)
    assert "--layers 48,24" in flags and "--hidden" not in flags
    assert "--hidden 32" in run_flags(Trainer(_settings("--hidden", "32").spec, rs.hp, rs.ds, load_luts()).identity)


JS_MODEL_FOR = r"""
const cases = DATA;
const out = [];
for (const c of cases) {
  const ds = { kind: c.kind, x_train: { shape: [1, c.width] }, classes: c.classes };
  const layers = c.layers_text !== null ? S.parseLayers(c.layers_text) : c.hidden;
  const spec = S.modelFor(ds, layers, 16);
  out.push({ spec: spec.toJson(), hidden: S.hiddenOf(spec), hidden_json: S.hiddenOf(spec.toJson()),
             settings: C.settingsOf({ task: "x", hyper: {}, model: spec.toJson() }) });
}
const errors = [];
for (const t of ["64,x", "", "64,0", Array(17).fill("8").join(","), "1.5"]) {
  try { S.parseLayers(t); errors.push(null); } catch (e) { errors.push(e.message); }
}
console.log(JSON.stringify({ out, errors }));
"""


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_js_model_for_makes_the_same_spec_as_python():
    digits, text = prepare_task("digits"), prepare_task("text")
    cases, want = [], []
    for ds, argv in [(digits, ()), (digits, ("--layers", "256,256")), (digits, ("--hidden", "40")),
                     (text, ("--task", "text", "--layers", "64,32,16")), (text, ("--task", "text"))]:
        rs = _settings(*argv)
        layers = next((argv[i + 1] for i, a in enumerate(argv) if a == "--layers"), None)
        hidden = int(argv[argv.index("--hidden") + 1]) if "--hidden" in argv else 128
        cases.append({"kind": ds.kind, "width": int(ds.x_train.shape[1]), "classes": ds.classes,
                      "layers_text": layers, "hidden": hidden})
        want.append(rs.spec)
    got = run_js(JS_MODEL_FOR, imports={"S": "engine/spec.js", "C": "engine/checkpoint.js"}, data=cases)
    for have, spec in zip(got["out"], want):
        assert have["spec"] == spec.to_json()
        assert have["hidden"] == have["hidden_json"] == hidden_of(spec)
        assert have["settings"]["layers"] == hidden_of(spec)
        assert have["settings"]["hidden"] == hidden_of(spec)[0]
    e = got["errors"]
    assert "comma-separated hidden widths" in e[0] and "comma-separated hidden widths" in e[1]
    assert "hidden widths must be >= 1" in e[2] and "at most 16 hidden layers" in e[3]
    assert "comma-separated hidden widths" in e[4]

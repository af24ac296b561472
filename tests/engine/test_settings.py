"""Every run setting checked once (daisychain/engine/settings.py SETTINGS) for every command
and the page (webui/engine/settings_check.js), held together by tests/data/settings_values.json.

What broke (issue 24): ``--lr inf`` / ``--lr 1e300`` / ``--weight-decay inf`` crashed
``train`` and ``cluster`` with a traceback (``cannot convert float NaN to integer``) and hung
``demo``; ``--steps 0`` printed ``loss: nan``; a bad value printed argparse's usage block
before its one line; the page took any positive learning rate."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from daisychain.engine.settings import PAGE_SETTINGS, SETTINGS, check_setting
from daisychain.engine.spec import Hyper, SpecError
from jsrun import run_js

ROOT = Path(__file__).resolve().parents[2]
VALUES = json.loads((ROOT / "tests" / "data" / "settings_values.json").read_text())


def test_python_gives_the_shared_reasons():
    assert VALUES["ranges"] == {n: SETTINGS[n].text for n in PAGE_SETTINGS}
    for case in VALUES["bad"]:
        with pytest.raises(SpecError) as e:
            check_setting(case["setting"], case["raw"])
        assert str(e.value) == case["reason"], case
    for case in VALUES["good"]:
        assert check_setting(case["setting"], case["raw"]) == case["value"], case


NODE_DRIVER = """
const values = JSON.parse(readFileSync(DATA, "utf8"));
const ranges = Object.fromEntries(Object.keys(S.SETTINGS).map((n) => [n, S.rangeText(n)]));
const bad = values.bad.map((c) => S.checkSetting(c.setting, c.raw).error);
const good = values.good.map((c) => S.checkSetting(c.setting, c.raw));
console.log(JSON.stringify({ ranges, bad, good }));
"""


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_page_gives_the_same_reasons():
    got = run_js(NODE_DRIVER, imports={"S": "engine/settings_check.js"}, data=str(ROOT / "tests" / "data" / "settings_values.json"))
    assert got["ranges"] == VALUES["ranges"]
    assert got["bad"] == [c["reason"] for c in VALUES["bad"]]
    assert [g["error"] for g in got["good"]] == [None] * len(VALUES["good"])
    assert [g["value"] for g in got["good"]] == [c["value"] for c in VALUES["good"]]


@pytest.mark.parametrize("hyper", [
    {"lr": math.inf}, {"lr": 1e300}, {"lr": math.nan}, {"weight_decay": math.inf},
    {"weight_decay": 2.0}, {"eps": math.inf},
])
def test_a_runs_hyperparameters_out_of_range_are_refused(hyper):
    """A host (a page, or a peer) that sends a run with these is refused by every member:
    Hyper.validate holds the same bounds as the flags."""
    with pytest.raises(SpecError):
        Hyper(**hyper).validate()


def _cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daisychain.cli", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("argv, words", [
    (("train", "--lr", "inf"), "--lr must be a finite number in (0, 1], not 'inf'"),
    (("train", "--lr", "1e300"), "--lr must be a finite number in (0, 1], not '1e300'"),
    (("train", "--weight-decay", "inf"), "--weight-decay must be a finite number in [0, 1]"),
    (("train", "--steps", "0"), "--steps must be a whole number in [1, 10000000], not '0'"),
    (("train", "--steps", "abc"), "--steps must be a whole number"),
    (("train", "--workers", "0"), "--workers must be a whole number in [1, 1024]"),
    (("demo", "--lr", "inf", "--steps", "5"), "--lr must be a finite number"),
    (("demo", "--peers", "0"), "--peers must be a whole number in [1, 32]"),
    (("cluster", "--lr", "inf", "--steps", "3"), "--lr must be a finite number"),
    (("cluster", "--timeout", "nan"), "--timeout must be a finite number in (0, 86400]"),
    (("train", "--assign", "nope"), "invalid choice: 'nope'"),
])
def test_a_bad_value_is_one_line_and_exit_2(argv, words):
    r = _cli(*argv, "--quiet")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert "usage:" not in r.stderr and "Traceback" not in r.stderr


def test_daisy_peer_bad_value_is_one_line():
    r = subprocess.run([sys.executable, "-m", "daisychain.peer.cli", "--server", "http://127.0.0.1:9",
                        "--lr", "nan", "--verify-rate", "0.5"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == ("daisy-peer: error: --lr must be a finite number in (0, 1], "
                                "not 'nan' (see daisy-peer --help)")


def test_every_setting_of_every_command_is_in_the_table():
    """No number flag of train/demo/cluster/daisy-peer parses outside SETTINGS."""
    import argparse

    from daisychain.cli import build_parser
    from daisychain.peer.cli import build_parser as peer_parser

    parsers = [peer_parser()]
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    parsers += [sub.choices[c] for c in ("train", "demo", "cluster")]
    for p in parsers:
        for a in p._actions:
            if a.type in (int, float):
                pytest.fail(f"{p.prog} {a.option_strings}: parsed by {a.type.__name__}, not checked "
                            f"against SETTINGS")
            if getattr(a.type, "__name__", "") in SETTINGS:
                assert a.dest == a.type.__name__
        text = " ".join(p.format_help().split())  # --help shows every range
        for a in p._actions:
            if getattr(a.type, "__name__", "") in SETTINGS:
                assert SETTINGS[a.dest].text.removeprefix("must be ") in text, (p.prog, a.dest)


def test_reliability_doc_table_is_what_the_commands_say():
    """docs/RELIABILITY.md's settings table is what scripts/settings_table.py gets by running
    every command with every bad value (it fails itself on any try that is not one line)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("settings_table", ROOT / "scripts" / "settings_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = (ROOT / "docs" / "RELIABILITY.md").read_text()
    a, b = doc.index(mod.BEGIN) + len(mod.BEGIN), doc.index(mod.END)
    assert doc[a:b].strip() == mod.table().strip()


HYPER_CASES = [{"lr": 1e300}, {"lr": 0.0}, {"lr": "inf"}, {"lr": "nan"}, {"weight_decay": 2.0},
               {"weight_decay": "inf"}, {"eps": 0.0}, {"beta1": 1.0}, {"lr": 1.0}]

HYPER_DRIVER = """
const num = (v) => (v === "inf" ? Infinity : v === "nan" ? NaN : v);
const cases = DATA;
console.log(JSON.stringify(cases.map((c) => {
  try { makeHyper(Object.fromEntries(Object.entries(c).map(([k, v]) => [k, num(v)]))); return null; }
  catch (e) { return e.message; }
})));
"""


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_a_received_runs_hyperparameters_get_the_same_words_in_both_languages():
    """Hyper.validate (a Python member) and makeHyper (a tab) are twins: a host's run with
    lr 1e300 is refused by both, with the same words (the tab took any positive lr)."""
    def py(c):
        try:
            Hyper(**{k: float(v) for k, v in c.items()}).validate()
            return None
        except SpecError as exc:
            return str(exc)

    want = [py(c) for c in HYPER_CASES]
    assert want[-1] is None and all(want[:-1])
    assert run_js(HYPER_DRIVER, imports={"{ makeHyper }": "engine/spec.js"}, data=HYPER_CASES) == want

"""One run protocol, two languages, one set of scenarios.

Every tests/scenarios/*.json describes a run as data: the replicas, then events in (room
changes, channels, messages someone injects, ticks, deaths, restores, computes). The Python
runner (tests/scenarios/scenario_net.py, daisychain.peer.run.RunPeer + frames.py + the
Python engine) and the JS runner (tests/scenarios/run_scenarios.mjs, run/index.js + frames.js
+ the JS engine, in node) play the SAME file and must write the SAME normalised output list:
every message on the wire (kind, run id, step, meta, codec and the SHA-256 of its body),
every compute asked for, every commit (loss, contributors, parameter hash), log line, alarm,
refusal, restore and end. Then the scenario's own expectations are checked (some output
present or absent, every survivor on ``daisychain train``'s hash).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from daisychain import package_path
from daisychain.engine.cli import train
from daisychain.units.luts import default_dir

HERE = Path(__file__).parents[1] / "scenarios"
sys.path.insert(0, str(HERE))
from scenario_net import run_scenario, settings  # noqa: E402

SCENARIOS = sorted(p for p in HERE.glob("*.json") if p.name not in ("frames.json", "split.json")) \
    + sorted(HERE.glob("ring/*.json"))  # frames / split: test_frames_shared.py, test_split_shared.py
pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node


def load(path: Path) -> dict:
    sc = json.loads(path.read_text())
    sc["name"] = path.stem
    return sc


@functools.lru_cache(maxsize=None)
def reference(argv: tuple) -> str:
    return train(settings(argv), quiet=True)["params_sha256"]


@functools.lru_cache(maxsize=None)
def js_results() -> dict:
    """All scenarios through the node runner in one process."""
    import shutil
    scs = [load(p) for p in SCENARIOS]
    by_settings: dict[tuple, list] = {}
    for sc in scs:
        by_settings.setdefault(tuple(sc["settings"]), []).append(sc)
    out = {}
    for argv, group in by_settings.items():
        rs = settings(argv)
        from daisychain.engine.trainer import Trainer
        from daisychain.units import load_luts
        tr = Trainer(rs.spec, rs.hp, rs.ds, load_luts())
        dcds = Path(__import__("tempfile").mkdtemp()) / "run.dcds"
        dcds.write_bytes(rs.ds.to_bytes())
        payload = {"webui": str(package_path("webui")), "luts": str(default_dir()), "dcds": str(dcds),
                   "identity": tr.identity, "steps": rs.steps, "scenarios": group}
        res = subprocess.run([shutil.which("node"), str(HERE / "run_scenarios.mjs")],
                             input=json.dumps(payload), capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-4000:]
        for r in json.loads(res.stdout):
            out[r["name"]] = r
    return out


def matches(pattern: list, output: list) -> bool:
    if len(pattern) > len(output):
        return False
    for p, o in zip(pattern, output):
        if p == "*":
            continue
        if isinstance(p, str) and p.startswith("~"):
            if not (isinstance(o, str) and p[1:] in o):
                return False
        elif p != o:
            return False
    return True


def first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            ctx = "\n".join(f"  {json.dumps(o)[:240]}" for o in a[max(0, i - 3):i])
            return (f"output {i} differs\n before:\n{ctx}\n python: {json.dumps(x)[:600]}\n"
                    f" js:     {json.dumps(y)[:600]}")
    return f"lengths differ: python {len(a)}, js {len(b)}; next: " + json.dumps(
        (a[len(b):] or b[len(a):])[:2])[:600]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_same_in_python_and_js(path):
    sc = load(path)
    py = run_scenario(sc)
    js = js_results()[sc["name"]]
    assert "error" not in js, js.get("error")
    assert py["outputs"] == js["outputs"], first_difference(py["outputs"], js["outputs"])
    assert py["final"] == js["final"]
    exp = sc.get("expect", {})
    for pat in exp.get("has", []):
        assert any(matches(pat, o) for o in py["outputs"]), f"no output matches {pat}"
    for pat in exp.get("lacks", []):
        assert not any(matches(pat, o) for o in py["outputs"]), f"an output matches {pat}"
    for pat, n in exp.get("count", []):
        got = sum(matches(pat, o) for o in py["outputs"])
        assert got == n, f"{got} outputs match {pat}, not {n}"
    if exp.get("reference"):
        want = reference(tuple(sc["settings"]))
        ends = {p: f for p, f in py["final"].items() if p not in exp.get("outside", [])}
        assert ends and all(f["sha"] == want for f in ends.values()), py["final"]


def test_every_scenario_is_named_in_the_readme():
    readme = (HERE / "README.md").read_text()
    for p in SCENARIOS:
        assert f"`{p.name}`" in readme, p.name

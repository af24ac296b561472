"""Dependency hygiene: every runtime dependency in pyproject.toml is imported by the package,
every test-extra one by the tests, the benches or an optional part of the package; and a test run without node fails (the JS
mirror tests never skip)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORT_NAME = {"scikit-learn": "sklearn", "pywebview": "webview", "pytest-timeout": "pytest_timeout",
               "zxing-cpp": "zxingcpp", "pillow": "PIL"}
# declared, not imported, and why (the reason must stay true)
NOT_IMPORTED = {
    "safetensors": "the .safetensors model export",
    "pytest-timeout": "a pytest plugin: the `timeout` setting in [tool.pytest.ini_options]",
    "pytest-xdist": "a pytest plugin: `scripts/test.sh -n 2`, the suite on two workers (opt-in)",
}


def dist_name(req: str) -> str:
    return re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0].strip().lower()


def imported(*dirs: str) -> set[str]:
    names = set()
    for d in dirs:
        for path in (ROOT / d).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.add(node.module.split(".")[0])
    return names


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def unused(reqs: list[str], names: set[str]) -> list[str]:
    return [d for d in map(dist_name, reqs)
            if IMPORT_NAME.get(d, d).replace("-", "_") not in names and d not in NOT_IMPORTED]


def test_every_runtime_dependency_is_imported_by_the_package():
    assert unused(project()["dependencies"], imported("daisychain")) == []


def test_every_test_dependency_is_imported_by_the_tests_benches_or_optional_parts():
    """(pywebview: the desktop window, daisychain/desktop, which tests/page/test_desktop.py runs)"""
    assert unused(project()["optional-dependencies"]["test"], imported("tests", "bench", "daisychain")) == []


def test_pytest_timeout_is_configured():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert cfg["timeout"] > 0


def test_a_run_without_node_fails_instead_of_skipping(tmp_path):
    """PATH without node: the JS tests fail with words, and pytest exits non-zero."""
    env = {**os.environ, "PATH": str(tmp_path)}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/wire/test_mesh_send_js.py", "tests/wire/test_peer_frames_js.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "node is not installed" in out and "skipped" not in out, out
    assert re.search(r"\b6 errors?\b", out), out  # every test of the two files


def test_no_test_skips_when_node_is_missing():
    """A JS mirror test takes the ``node`` fixture or tests/jsrun.py (both fail without node);
    a skip on a missing node would make a run that never ran the JS side look green."""
    found = []
    for path in (ROOT / "tests").rglob("*.py"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            near = " ".join(lines[max(0, i - 2):i + 3]).lower()
            if re.search(r"pytest\.skip\(|mark\.skipif\(", line) and "node" in near:
                found.append(f"{path.relative_to(ROOT)}:{i + 1}")
    assert found == []


def test_js_snippets_run_through_jsrun():
    """One node driver (tests/jsrun.py): no test writes its own driver script or runs node
    on an inline snippet (tests/scenarios/run_scenarios.mjs, a runner file, is run as it is)."""
    inline = re.compile(r'from "node:fs"|--input-type=module|\[(node|NODE|"node"), (str\(driver|"-e")')
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
             if p.name not in ("test_hygiene.py", "jsrun.py") and inline.search(p.read_text())]
    assert found == []


def test_a_tier_skipped_silently_fails_the_run():
    """The mesh tier outside the private network namespace skips its tests (they cannot run
    there): the run fails and says why, unless the tier was deselected on purpose."""
    env = {k: v for k, v in os.environ.items() if k != "DAISY_IN_NETNS"}
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "tests/test_hygiene.py::test_pytest_timeout_is_configured",
            "tests/browser_mesh/test_ring_tab.py"]
    res = subprocess.run(base, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "were skipped because the tier cannot run here" in out, out
    assert "private network namespace" in out, out
    res = subprocess.run(base + ["-m", "not browser and not mesh"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "1 passed" in out and "deselected" in out and "tier cannot run" not in out, out

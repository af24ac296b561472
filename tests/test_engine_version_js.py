"""The engine version is one value in both languages: Python's ``daisychain.ENGINE_VERSION``
and the page's ``engine/trainer.js`` ``ENGINE_VERSION`` (two peers train together only when
theirs are equal; a bump on one side alone would split every mixed room)."""

from __future__ import annotations

import json
import subprocess

import pytest

from daisychain import ENGINE_VERSION, package_path


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_the_js_engine_version_is_pythons(node):
    uri = package_path("webui", "engine", "trainer.js").as_uri()
    js = f"const m = await import({json.dumps(uri)}); console.log(JSON.stringify(m.ENGINE_VERSION));"
    out = subprocess.run([node, "--input-type=module", "-e", js], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ENGINE_VERSION

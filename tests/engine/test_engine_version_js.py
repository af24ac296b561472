"""The engine version is one value in both languages: Python's ``daisychain.ENGINE_VERSION``
and the page's ``engine/trainer.js`` ``ENGINE_VERSION`` (two peers train together only when
theirs are equal; a bump on one side alone would split every mixed room)."""

from __future__ import annotations

import pytest

from daisychain import ENGINE_VERSION
from jsrun import run_js


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_the_js_engine_version_is_pythons():
    got = run_js("console.log(JSON.stringify(T.ENGINE_VERSION));", imports={"T": "engine/trainer.js"})
    assert got == ENGINE_VERSION

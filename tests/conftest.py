"""Shared pytest fixtures. Tiers: unit (no I/O), functional (real loopback server),
browser (headless Chromium), mesh (real WebRTC inside the private network namespace)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from daisychain.units.luts import default_dir
from jsrun import node_binary


@pytest.fixture
def lut_copy(tmp_path: Path) -> Path:
    """A private copy of the committed tables, safe to corrupt."""
    dst = tmp_path / "luts"
    shutil.copytree(default_dir(), dst)
    return dst


@pytest.fixture
def node() -> str:
    """The node binary. Without it the JS tests FAIL (never skip): a test run that did not
    run the JS side must not look green."""
    return node_binary()

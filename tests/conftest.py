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


# -- a tier skipped silently fails the run (issue 34, item 7) ----------------------------------

#: skip reasons that mean a whole tier did not run: no Playwright, no private network namespace
TIER_SKIPS = ("could not import 'playwright", "private network namespace")
_tier_skips: list[tuple[str, str]] = []


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _note_tier_skip(report) -> None:
    if report.skipped:
        reason = _skip_reason(report)
        if any(words in reason for words in TIER_SKIPS):
            _tier_skips.append((report.nodeid, reason.removeprefix("Skipped: ")))


def pytest_collectreport(report):
    _note_tier_skip(report)  # a module-level importorskip


def pytest_runtest_logreport(report):
    _note_tier_skip(report)


def pytest_sessionfinish(session, exitstatus):
    """A browser or mesh test that was collected and then skipped because its tier cannot run
    here makes the run fail: a run that never ran a tier must not look green. Leaving a tier
    out on purpose is deselecting it (``-m "not browser and not mesh"``, ``-k``, or not naming
    its folder), which skips nothing."""
    if _tier_skips and exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if _tier_skips:
        reasons = sorted({r for _, r in _tier_skips})
        terminalreporter.write_line(
            f"FAILED: {len(_tier_skips)} test(s) of a tier were skipped because the tier cannot run "
            f"here ({'; '.join(reasons)[:400]}); run them where it can (scripts/test.sh), or "
            "deselect the tier on purpose (-m \"not browser and not mesh\")", red=True)

"""Hostile tier: small hostile clients against a real ``daisychain serve`` process."""

from __future__ import annotations

import pytest

from hostile import ServerProcess


@pytest.fixture
def serve(tmp_path):
    """``serve(*flags)`` starts a server process; all are stopped at the end of the test."""
    started: list[ServerProcess] = []

    def start(*flags, **kw) -> ServerProcess:
        srv = ServerProcess(tmp_path, *flags, **kw)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()

"""Mesh tier, failures of the server: the signaling server is a real ``daisychain serve``
process that the test kills (SIGKILL) in the middle of a run of real ``daisy-peer``
processes. The data channels do not need it, so the run must finish with the reference hash;
the peers say that they lost the server, try to resume their identity when it is back, and
(a restarted server knows no room and no token) say clearly that they finish without it.

    scripts/in-netns.sh .venv/bin/python -m pytest tests/mesh/test_robustness.py -q
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .test_mesh import LONG, ROOT, host, peers, reference  # noqa: F401 (peers is a fixture)

BIN = Path(sys.executable).parent


class ServerProcess:
    """`daisychain serve` on a fixed port, so that a restarted one is at the same address."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServerProcess":
        self.proc = subprocess.Popen([str(BIN / "daisychain"), "serve", "--host", "127.0.0.1",
                                      "--port", str(self.port)], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.proc.stdout.readline()
        assert "DaisyChain serving on" in line, line + self.proc.stdout.read()
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def server_process():
    made: list[ServerProcess] = []

    def make() -> ServerProcess:
        s = ServerProcess().start()
        made.append(s)
        return s
    yield make
    for s in made:
        s.kill()


def test_server_killed_mid_run_the_peers_finish_on_the_hash(server_process, peers):
    """Regression: a peer used to abort ("the signaling connection closed") as soon as the
    server's WebSocket went away, although its data channels were fine."""
    srv = server_process()
    h, code = host(peers, srv.url, LONG, 2)
    members = [peers(srv.url, "--room", code, name=f"m{i}") for i in (1, 2)]
    for m in members:
        m.wait_for("joined run")
    h.wait_for(r"train: +\d+%.*?\| *[1-9]\d*/")  # steps are being committed
    srv.kill()
    everyone = [h, *members]
    for p in everyone:
        p.wait_for("lost the signaling server")
    srv.start()  # a fresh process at the same address: it knows no room and no token
    ref = reference(LONG)
    for p in everyone:
        assert p.hash() == ref
        assert "no longer knows this device" in p.stderr(), p.stderr()[-3000:]
        # each loud line once (logging and the progress line both printed it)
        assert p.stderr().count("lost the signaling server") == 1, p.stderr()[-3000:]

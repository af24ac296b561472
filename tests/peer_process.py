"""A real ``daisy-peer`` process for tests: stderr in a file to poll, stdout for the summary."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER = [sys.executable, "-c", "import sys; from daisychain.peer.cli import main; sys.exit(main())"]


class PeerProcess:
    def __init__(self, server: str, *args: str, name: str, err_dir: Path):
        self.name = name
        self.err_path = Path(err_dir) / f"dc-peer-{name}-{time.time_ns()}.err"
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen([*PEER, "--server", server, "--name", name, *args],
                                     stdout=subprocess.PIPE, stderr=self.err, text=True, cwd=ROOT)

    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_for(self, pattern: str, timeout=60.0) -> re.Match:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = re.search(pattern, self.stderr())
            if m:
                return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: no {pattern!r} in:\n{self.stderr()[-3000:]}")

    def finish(self, timeout=120.0) -> tuple[int, str]:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            raise AssertionError(f"{self.name} did not finish:\n{self.stderr()[-3000:]}")
        return self.proc.returncode, out

    def hash(self) -> str:
        rc, out = self.finish()
        m = re.search(r"^params-sha256: ([0-9a-f]{64})$", out, re.M)
        assert rc == 0 and m, f"{self.name} rc={rc}\n{out}\n{self.stderr()[-3000:]}"
        return m.group(1)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.err.close()

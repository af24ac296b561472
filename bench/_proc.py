"""What the benches' process wrappers share (bench/chaos.py, bench/scaling.py)."""

from __future__ import annotations

import re
import subprocess
import time
from typing import Callable


def wait_for_log(proc: subprocess.Popen, read: Callable[[], str], pattern: str,
                 timeout: float) -> re.Match | None:
    """The first match of ``pattern`` in what ``read()`` returns (a process's log), polled
    until ``timeout`` seconds pass or ``proc`` exits; None if it never appears."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        m = re.search(pattern, read())
        if m:
            return m
        time.sleep(0.05)
    return re.search(pattern, read())

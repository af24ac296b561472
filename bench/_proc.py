"""What the benches' process wrappers share (bench/chaos.py, bench/scaling.py; the CPU time
of a process or thread from /proc: bench/threads.py, procs_cpu.py, browser_pool.py)."""

from __future__ import annotations

import os
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


def stat_cpu_s(text: str) -> float:
    """CPU seconds (user + system) in the text of a /proc/PID/stat or /proc/PID/task/TID/stat
    file (its fields after the command name, which may hold spaces and parentheses)."""
    f = text[text.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def pid_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        return stat_cpu_s(f.read())

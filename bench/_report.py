"""Write one benchmark's section into docs/BENCHMARKS.md, leaving the other sections alone.

Each bench owns the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"
HEADER = """# Benchmarks

Every number here was produced by the command written above its table, on the machine
named with it. Speeds are reported as ratios against a baseline measured in the same run,
because absolute timings on a shared machine are noisy. Tests never assert timings.
"""


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{datetime.now(timezone.utc):%Y-%m-%d}")


def write_section(name: str, body: str, command: str | None = None) -> None:
    command = command or "python " + " ".join(sys.argv)
    text = DOC.read_text() if DOC.exists() else HEADER
    block = (f"<!-- bench:{name} -->\n{body.rstrip()}\n\nCommand: `{command}`  \n"
             f"Machine: {machine()}\n<!-- /bench:{name} -->")
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)

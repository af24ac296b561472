"""The desktop window: pywebview (Qt WebEngine, offscreen) loads the real page from the real
local server."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_desktop_window_loads_the_page():
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    env.pop("DISPLAY", None)
    out = subprocess.run([sys.executable, "-m", "daisychain.cli", "desktop", "--probe", "60"],
                         capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    line = [l for l in out.stdout.splitlines() if l.startswith("{")][-1]
    info = json.loads(line)
    assert info["loaded"] and "DaisyChain" in info["title"]
    assert "DaisyChain desktop: http://127.0.0.1:" in out.stdout

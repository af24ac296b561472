"""An internal error in a peer ends the run with its reason and a non-zero exit, never a hang.

What broke (issue 24): ``daisychain demo --lr inf --steps 5`` printed "internal error while
handling channel open (the run goes on)" and then hung with no progress until killed: every
exception in the peer's run loop was logged and swallowed. Here a real demo (server + two
real daisy-peer nodes over aiortc on loopback) runs with a bug planted in the run state
machine at step 2; it must exit 1 with the reason within the timeout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
import daisychain.peer.run as R
real = R.RunPeer.computed
def computed(self, step, task, result, *rest):
    if step >= 2:
        raise RuntimeError(f"planted bug at step {step}")
    return real(self, step, task, result, *rest)
R.RunPeer.computed = computed
from daisychain.cli import main
sys.exit(main(["demo", "--peers", "2", "--steps", "8", "--hidden", "16", "--port", "0",
               "--quiet"]))
"""


def test_demo_ends_on_an_internal_error_with_its_reason():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 1, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("daisychain demo: internal error while handling a finished compute: "
                           "RuntimeError: planted bug at step 2"), r.stderr[-2000:]

"""bench/tab_rooms.py's report (ratios against the 1-tab room of the same round and batch, the
hash column, a stalled room) and bench/delay_line.py's line (a packet between two namespaces
waits the delay each way; it is a property of the line, not a speed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.tab_rooms import report

ROOT = Path(__file__).resolve().parents[2]


def _row(rnd, batch, room, sps, shas=("h",), error=None):
    r = {"round": rnd, "batch": batch, "room": room, "steps": 16, "steps_s": sps, "shas": list(shas), "reference": "h",
         "agreed": True, "done": {"a": 40}, "devices": [{"kind": "cpu", "cpuPath": "wasm", "workers": 1}],
         "load": [1.0, 2.0]}
    if error:
        r["error"] = error
    return r


def test_report_pairs_each_room_with_the_one_tab_room_of_its_round_and_batch():
    echo = {"median_ms": 2.3, "p10_ms": 2.2, "p90_ms": 3.0}
    res = {"rows": [_row(1, 64, "1 tab", 2.0), _row(1, 64, "2 tabs", 3.0), _row(2, 64, "1 tab", 1.0),
                    _row(2, 64, "2 tabs", 1.5, shas=("h", "x")), _row(1, 256, "1 tab", 0.5),
                    _row(1, 256, "2 tabs + 1 daisy-peer", None, error="not done in 600 s at step 3")],
           "echo": {"tab-tab": echo, "tab-server": echo}, "delay_ms": 1.0, "line": "READY 5 namespaces",
           "cpus": 2}
    text = report(res)
    assert "| 1 | 64 | 2 tabs | 3.00 | 1.50x |" in text
    assert "| 2 | 64 | 2 tabs | 1.50 | 1.50x |" in text and text.count("| NO |") == 1
    assert "| 1 | 256 | 2 tabs + 1 daisy-peer | - | - |" in text and "not done in 600 s at step 3" in text
    assert "tab to tab 2.30 ms [2.20, 3.00]" in text and "(16 steps at batch 64, 16 steps at batch 256)" in text


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/net/tun") or not shutil.which("unshare"),
                    reason="needs root, /dev/net/tun and unshare (network namespaces)")
def test_the_delay_line_holds_every_packet_each_way(tmp_path):
    script = f"""
set -e
ip link set lo up
unshare -n -- sleep 60 & A=$!
unshare -n -- sleep 60 & B=$!
while [ "$(readlink /proc/$A/ns/net)" = "$(readlink /proc/self/ns/net)" ] || \\
      [ "$(readlink /proc/$B/ns/net)" = "$(readlink /proc/self/ns/net)" ]; do sleep 0.01; done
{sys.executable} -m bench.delay_line --delay-ms 5 self:10.79.0.1 $A:10.79.0.11 $B:10.79.0.12 > line.out &
L=$!
for i in $(seq 100); do grep -q READY line.out && break; sleep 0.05; done
{sys.executable} -m bench.delay_line --echo $A $B 10.79.0.12
kill $L $A $B
"""
    out = subprocess.run(["unshare", "-n", "--", "bash", "-c", script], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode in (0, 143), out.stderr[-2000:]
    echo = json.loads(out.stdout.strip().splitlines()[-1])
    assert echo["n"] == echo["sent"] == 200  # nothing lost
    assert echo["p10_ms"] >= 10.0, echo  # 5 ms each way: no round trip shorter than 10 ms

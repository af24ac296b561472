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


def test_room_phases_times_the_handling_piece_by_piece():
    from bench.tab_rooms import room_phases

    def step_trace(t, k):  # one 2-tab step of the --trace logs, from t: the host's and the guest's
        host = [[t, "step", k], [t + 1, "send0", 50000], [t + 2, "op0", "contribute"], [t + 20, "op1", "contribute"],
                [t + 40, "bytes", 46000], [t + 41, "rcv0", "contrib"], [t + 41.5, "x0", "_commit"],
                [t + 43.5, "x0", "apply"], [t + 44, "x1", "apply"], [t + 44, "x0", "encode"], [t + 47, "x1", "encode"],
                [t + 47, "x0", "record"], [t + 47.3, "x1", "record"], [t + 47.3, "x0", "rehash"],
                [t + 48.1, "x1", "rehash"], [t + 48, "x0", "begin"], [t + 48.5, "x1", "begin"], [t + 48.5, "x1", "_commit"],
                [t + 48.5, "rcv1", "contrib"], [t + 48.5, "out", "send:total"], [t + 48.5, "out", "committed"]]
        guest = [[t + 15, "bytes", 50000], [t + 16.5, "rcv0", "total"], [t + 16.5, "x0", "apply"], [t + 17, "x1", "apply"],
                 [t + 17, "x0", "record"], [t + 17.1, "x1", "record"], [t + 17.1, "x0", "rehash"], [t + 17.8, "x1", "rehash"],
                 [t + 18, "rcv1", "total"], [t + 18, "out", "committed"], [t + 18.3, "step", k], [t + 18.4, "op0", "contribute"],
                 [t + 30, "op1", "contribute"], [t + 31, "send0", 46000]]
        return host, guest

    host, guest = [], []
    for k in range(20, 26):
        h, g = step_trace(50.0 * k, k)
        host += h
        guest += g
    for log in (host, guest):
        log.sort(key=lambda e: e[0])
    ph = room_phases([host, guest], 21)
    assert ph["host_sum"] == 2.0 and ph["host_adam"] == 0.5 and ph["host_encode"] == 3.0
    assert ph["host_record"] == 0.3 and ph["host_hash"] == 0.8 and ph["host_split"] == 0.5 and ph["host_commit"] == 7.0
    assert ph["host_page"] == 1.5  # its committed output at 48.5, its page's next step event at 50
    assert ph["guest_decode"] == 1.5 and ph["guest_adam"] == 0.5 and ph["guest_record"] == 0.1
    assert ph["guest_hash"] == 0.7 and ph["guest_page"] == 0.3
    assert ph["down"] == 14.0 and ph["up"] == 9.0 and ph["step"] == 50.0


def test_a_local_steps_room_reports_to_a_section_of_its_own():
    """A `--replicas/--sync-every` run never replaces the synchronous run's figures."""
    from bench.tab_rooms import section_of

    assert section_of({"pinned": True, "local": [1, 1]})[0] == "tab_rooms_pinned"
    assert section_of({"pinned": False})[0] == "tab_rooms"
    name, title = section_of({"pinned": True, "local": [2, 32]})
    assert name == "tab_rooms_local" and "--replicas 2 --sync-every 32" in title


def test_udp_drops_counts_a_namespaces_receive_buffer_errors():
    """The bench's drop column: the Udp RcvbufErrors counter of /proc/PID/net/snmp (not the
    Ip or UdpLite lines), read here for our own namespace and from a known text."""
    from bench.tab_rooms import rcvbuf_errors, udp_drops

    snmp = ("Ip: Forwarding InReceives\nIp: 1 5\n"
            "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n"
            "Udp: 900 2 207 880 206 0\n"
            "UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n"
            "UdpLite: 0 0 0 0 9 0\n")
    assert rcvbuf_errors(snmp) == 206
    assert isinstance(udp_drops(os.getpid()), int)

"""Unit tier: what one member can send another (issue 9, Trust), in the Python-only parts:
``daisy-peer --fault`` (``peer/faults.py``'s liars, through ``run_net.Net``), the spot-check
draw, the node's ticker, the aiortc shell (real ``RTCPeerConnection`` objects) and the
``--capacity`` flag. What the run roles do with bad input is played in both languages by
``tests/scenarios/*.json`` (test_scenarios.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from daisychain.engine.cli import train
from daisychain.peer import frames as F
from daisychain.peer import run as R

MODES = ["flip", "nan-meta", "random", "scale", "stale"]  # daisy-peer --fault (exact names)
from run_net import Net, settings


@pytest.fixture(scope="module")
def rs():
    return settings()


@pytest.fixture(scope="module")
def ref(rs):
    return train(rs, quiet=True)


class LyingNet(Net):
    """Net where ``liar`` corrupts what it sends (daisy-peer --fault) and a frame a peer
    refuses goes to its ``bad_message``; a peer the coordinator removes is taken out."""

    def __init__(self, rs, n, liar=None, mode=None, **kw):
        from daisychain.peer.faults import Liar
        self.liar_id, self.lie = liar, Liar(mode) if mode else None
        self._rate = kw.pop("verify_rate", 1.0)
        R_init = R.RunPeer.__init__

        def init(peer, *a, **k):
            k.setdefault("verify_rate", self._rate)
            k.setdefault("verify_key", "test-key")
            R_init(peer, *a, **k)
        R.RunPeer.__init__ = init
        try:
            super().__init__(rs, n, **kw)
        finally:
            R.RunPeer.__init__ = R_init

    def feed(self, pid, outputs):
        for o in outputs:
            if isinstance(o, R.Send) and pid == self.liar_id and self.lie and pid not in self.dead \
                    and o.to not in self.dead:
                msg, nan = self.lie.corrupt(o.message)
                peer = self.peers[pid]
                for fr in F.encode_frames(F.to_message(msg, peer.run_id, peer.bounds), 0, _allow_nan=nan):
                    self.wire.append((pid, o.to, fr))
            else:
                super().feed(pid, [o])
            if isinstance(o, R.Alarm) and o.kind == "removed" and o.peer not in self.dead:
                self.kill(o.peer, "p0")


# -- spot-checks -----------------------------------------------------------------------------


def test_fault_modes_are_the_documented_ones():
    from daisychain.peer.faults import FAULTS
    assert sorted(FAULTS) == MODES


@pytest.mark.parametrize("mode", MODES)
def test_a_lying_peer_is_named_removed_and_the_run_ends_on_the_reference(rs, ref, mode):
    net = LyingNet(rs, 3, liar="p2", mode=mode)
    net.run()
    for pid in ("p0", "p1"):
        assert net.of(R.Ended, pid)[0].params_sha256 == ref["params_sha256"]
    alarms = net.of(R.Alarm, "p0")
    assert alarms and all(a.peer == "p2" for a in alarms)
    assert alarms[-1].kind == "removed" and alarms[-1].step <= 2
    texts = [e.text for e in net.of(R.Log, "p0")]
    first = "refused a message from p2" if mode == "nan-meta" else "spot-check mismatch: p2"
    assert any(t.startswith(first) for t in texts)
    assert any(t.startswith("liar removed: p2") for t in texts)


def test_checked_micro_batches_follow_the_rate():
    assert R.checked_micro("k", 3, 64, 0.0) == []
    assert R.checked_micro("k", 3, 64, 1.0) == list(range(64))
    n = sum(len(R.checked_micro("k", s, 64, 0.05)) for s in range(100))
    assert 200 < n < 450  # about 5 % of 6400
    assert R.checked_micro("k", 3, 64, 0.3) != R.checked_micro("other", 3, 64, 0.3)


# -- the shell: background errors, ICE, queues -------------------------------------------------


def test_an_exception_in_the_ticker_is_logged_and_ticking_goes_on(caplog):
    from daisychain.peer.node import Node, NodeOptions

    node = Node(NodeOptions(server="http://127.0.0.1:9"))
    calls = []

    class Boom:
        def tick(self, now):
            calls.append(now)
            if len(calls) == 1:
                raise ValueError("capacity_split: NaN")
            return []

    node.run = Boom()

    async def go():
        t = asyncio.ensure_future(node._tick())
        for _ in range(100):
            await asyncio.sleep(0.05)
            if len(calls) >= 3:
                break
        t.cancel()
    with caplog.at_level(logging.ERROR, "daisychain.peer"):
        asyncio.run(go())
    assert len(calls) >= 3
    assert any("internal error" in r.getMessage() for r in caplog.records)


def _mesh():
    from daisychain.peer.rtc import Mesh

    async def signal(*a):
        pass
    return Mesh("a", signal, lambda p: None, lambda p, d: None, lambda p: None)


@pytest.mark.parametrize("text", ["candidate:garbage", "candidate:1 1 udp", "", "x" * 50])
def test_a_malformed_ice_candidate_gets_a_named_refusal(caplog, text):
    async def go():
        mesh = _mesh()
        link = mesh._link("b")
        link.remote_set = True
        await link.on_candidate({"candidate": text or "candidate:", "sdpMid": "0", "sdpMLineIndex": 0})
        await mesh.close()
    with caplog.at_level(logging.WARNING, "daisychain.peer"):
        asyncio.run(go())
    assert any("refused an ICE candidate from b" in r.getMessage() for r in caplog.records)


def test_a_peer_that_does_not_read_is_dropped_once(caplog, monkeypatch):
    from daisychain.peer import rtc

    monkeypatch.setattr(rtc, "MAX_QUEUED", 1 << 20)
    closed = []

    async def go():
        mesh = _mesh()
        mesh.on_close = closed.append
        link = mesh._link("b")
        link.opened = True  # open, but its writer never drains (the other side does not read)
        frame = bytes(60000)
        sent = [mesh.send("b", [frame]) for _ in range(40)]
        await asyncio.sleep(0.1)
        await mesh.close()
        return sent
    with caplog.at_level(logging.WARNING, "daisychain.peer"):
        sent = asyncio.run(go())
    assert sent[:17] == [True] * 17 and not any(sent[18:])
    assert closed == ["b"]
    assert sum("does not read" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("flag", ["inf", "nan", "1e999", "0", "-3", "1e10", "fast"])
def test_capacity_flag_refuses_what_a_ready_would_refuse(flag):
    """daisy-peer and daisychain cluster share one --capacity parser, held to the same range
    as a ``ready`` message (``inf`` used to pass the peer's flag)."""
    import argparse

    from daisychain.engine.settings import capacity_arg

    with pytest.raises(argparse.ArgumentTypeError):
        capacity_arg(flag)
    assert capacity_arg("auto") is None and capacity_arg("46.5") == 46.5

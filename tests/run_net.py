"""The run protocol's in-process network for the run tests: N replicas of
``daisychain.peer.run`` on a perfect, ordered network, every message through the real frame
encoder and reassembler, computes run synchronously in an order the test controls (so that
drops, duplicates and late contributions happen exactly where wanted)."""

from __future__ import annotations

import argparse
from collections import deque

from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.spec import Hyper, ModelSpec
from daisychain.engine.local import make_trainer
from daisychain.peer import frames as F
from daisychain.peer import run as R
from daisychain.units import load_luts

STEPS = 6


def settings(*argv):
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return settings_from_args(p.parse_args(["--steps", str(STEPS), *argv]))


def make_member_trainer(identity, ds):
    return make_trainer(ModelSpec.from_json(identity["model"]), Hyper(**identity["hyper"]), ds, load_luts())


class Net:
    """N replicas on a perfect, ordered network; p0 is the host."""

    def __init__(self, rs, n=3, wait=None, caps=None):
        self.rs = rs
        self.peers: dict[str, R.RunPeer] = {}
        host = R.RunPeer("p0", trainer=make_trainer(rs.spec, rs.hp, rs.ds, load_luts()), steps=rs.steps,
                         capacity=(caps or {}).get("p0", 1.0),
                         wait_peers=n - 1 if wait is None else wait)
        self.peers["p0"] = host
        for i in range(1, n):
            pid = f"p{i}"
            self.peers[pid] = R.RunPeer(
                pid, make_trainer=make_member_trainer, capacity=(caps or {}).get(pid, 1.0),
                selftest=(True, "ok"))
        self.wire: deque = deque()          # (sender, to, frame bytes)
        self.computes: deque = deque()      # (peer, Compute)
        self.reasm: dict = {}
        self.events: list = []
        self.bytes = 0
        self.now = 0.0
        self.dead: set[str] = set()
        self.announce_room()
        for a in self.peers:
            for b in self.peers:
                if a != b:
                    self.feed(a, self.peers[a].channel_open(b))
        self.feed("p0", host.start(0.0))

    def room(self):
        return [p for p in self.peers if p not in self.dead]

    def announce_room(self, host="p0"):
        for pid in self.room():
            self.feed(pid, self.peers[pid].room_changed(self.room(), host))

    def add(self, pid, **kw):
        self.peers[pid] = R.RunPeer(pid, make_trainer=make_member_trainer, capacity=1.0, **kw)
        host = next(p for p in self.room() if self.peers[p].coordinating)
        self.announce_room(host)
        for other in self.room():
            if other != pid:
                self.feed(pid, self.peers[pid].channel_open(other))
                self.feed(other, self.peers[other].channel_open(pid))

    def kill(self, pid, new_host=None):
        self.dead.add(pid)
        self.wire = deque(w for w in self.wire if w[0] != pid and w[1] != pid)
        self.computes = deque(c for c in self.computes if c[0] != pid)
        self.announce_room(new_host or next(p for p in self.room()))

    def feed(self, pid, outputs):
        for o in outputs:
            if isinstance(o, R.Send):
                if o.to in self.dead or pid in self.dead:
                    continue
                peer = self.peers[pid]
                msg = F.to_message(o.message, peer.run_id, peer.bounds)
                for fr in F.encode_frames(msg, 0):
                    assert len(fr) <= F.MAX_FRAME
                    self.bytes += len(fr)
                    self.wire.append((pid, o.to, fr))
            elif isinstance(o, R.Compute):
                self.computes.append((pid, o))
            elif isinstance(o, R.FetchData):
                self.feed(pid, self.peers[pid].data(self.rs.ds.to_bytes()))
            else:
                self.events.append((pid, o))

    def pump_wire(self, everything=False):
        """Deliver one frame (or all); False when nothing was in flight. A frame that does
        not parse goes to the receiver's ``bad_message`` (as node.py does)."""
        moved = False
        while self.wire:
            sender, to, fr = self.wire.popleft()
            moved = True
            r = self.reasm.setdefault((sender, to), F.Reassembler())
            peer = self.peers[to]
            try:
                m = r.feed(fr)
                if m is not None:
                    tr = peer.trainer
                    msg = F.from_message(m, tr.total_size if tr else None, tr.state_sizes if tr else None)
            except F.FrameError as exc:
                self.reasm[(sender, to)] = F.Reassembler()
                self.feed(to, peer.bad_message(sender, str(exc)))
                m = None
            if m is not None:
                self.feed(to, peer.receive(sender, msg, m.run_id))
            if not everything:
                break
        return moved

    def do_compute(self, pid, c):
        peer = self.peers[pid]
        result = R.contribute_at(peer.trainer, c.theta, c.step, c.micro)
        self.feed(pid, peer.computed(c.step, c.task, result))

    def run(self, hook=None, limit=100000):
        for _ in range(limit):
            if hook is not None and hook(self):
                continue
            if self.pump_wire():
                continue
            if self.computes:
                self.do_compute(*self.computes.popleft())
                continue
            if all(self.peers[p].ended or self.peers[p].refused for p in self.room()):
                return
            self.now += 1.0
            for pid in self.room():
                self.feed(pid, self.peers[pid].tick(self.now))
        raise AssertionError("the run did not end")

    def of(self, cls, pid=None):
        return [e for p, e in self.events if isinstance(e, cls) and (pid is None or p == pid)]

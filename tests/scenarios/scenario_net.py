"""The Python runner of the shared run-protocol scenarios (tests/scenarios/*.json).

A scenario drives a few replicas of ONE language on a perfect, ordered network: every
message between them goes through the real frame encoder and reassembler, every compute is
the real engine on a tiny model, so the outputs are bit-comparable with the JS runner
(run_scenarios.mjs), which does the same with webui/run/ (through run/index.js) and
frames.js. Both write the same normalised output list; tests/run/test_scenarios.py asserts the two lists are equal and checks
the scenario's expectations. Ops are described in tests/scenarios/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import deque

import numpy as np

from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.spec import Hyper, ModelSpec
from daisychain.engine.local import make_trainer as build_trainer
from daisychain.peer import frames as F
from daisychain.peer import run as R
from daisychain.units import load_luts

MAX_ITER = 20000


def settings(argv):
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return settings_from_args(p.parse_args(list(argv)))


def flip12(v: int) -> int:
    return int(np.int64(v) ^ np.int64(1 << 12))


def corrupt(ints: np.ndarray, fault, step: int, last: dict | None = None) -> np.ndarray:
    """The harness's liars (as peer/faults.py): flip bit 12 of one value, double all, put
    one value past the clamp bound, or send the previous contribution again (``stale``:
    zeros at first; ``last`` holds it)."""
    ints = np.array(ints, np.int64)
    if fault == "stale":
        prev = last.get("ints") if last is not None else None
        last["ints"] = ints
        return prev if prev is not None else np.zeros_like(ints)
    if fault == "flip":
        ints[step % ints.size] = flip12(ints[step % ints.size])
    elif fault == "scale":
        ints = ints * 2
    elif fault == "huge":
        ints[0] = 2 ** 52
    elif fault == "neg-half":  # a local-steps run's: the last moment half negative
        ints[-1] = -1
    else:
        raise ValueError(f"unknown fault {fault}")
    return ints


def body_sha(body: bytes) -> str:
    return hashlib.sha256(bytes(body)).hexdigest()[:16]


def loss12(x):
    """A displayed loss to 12 significant digits: its ``log`` is each language's libm (the
    bits of the run never depend on it), which may differ in the last place."""
    return float(format(x, ".12g")) if isinstance(x, float) else x


def norm_message(m: F.Message) -> list:
    """kind, run id, step, meta and the SHA-256 of the body: of the integers (int64 LE) for
    CONTRIB / TOTAL / RING, whose codec each side picks (JS has no synchronous zlib), else of the
    bytes."""
    kind = m.meta.get("t") if m.type == F.FrameType.CONTROL else m.type.name.lower()
    body = m.body
    if m.type in (F.FrameType.CONTRIB, F.FrameType.TOTAL, F.FrameType.RING) and m.codec != F.Codec.NONE:
        try:
            body = F.decode_ints(m.codec, m.body).astype("<i8").tobytes()
        except F.FrameError:  # hostile bytes (an injected body no decoder takes): as sent
            pass
    meta = {**m.meta, "loss": loss12(m.meta["loss"])} if "loss" in m.meta else m.meta
    return [kind, m.run_id, m.step, meta, body_sha(body)]


def norm_output(pid: str, o) -> list | None:
    if isinstance(o, R.Compute):
        return ["compute", pid, o.step, o.task, list(o.micro)]
    if isinstance(o, R.FetchData):
        return ["fetch", pid, o.task, o.fingerprint]
    if isinstance(o, R.Committed):
        return ["committed", pid, o.step, loss12(o.loss), [list(c) for c in o.contributors], o.mine,
                o.params_sha256]
    if isinstance(o, R.Refused):
        return ["refused", pid, o.peer, list(o.reasons)]
    if isinstance(o, R.Log):
        return ["log", pid, bool(o.loud), o.text]
    if isinstance(o, R.Ended):
        return ["ended", pid, o.step, o.params_sha256, bool(o.agreed)]
    if isinstance(o, R.Removed):
        return ["removed", pid, o.by, o.reason]
    if isinstance(o, R.Restored):
        return ["restored", pid, o.step, o.params_sha256, o.by]
    if isinstance(o, R.Alarm):
        return ["alarm", pid, o.kind, o.peer, o.name, o.step, o.micro, o.strikes, o.text]
    raise TypeError(f"unknown output {o!r}")


def xorshift32(x: int) -> int:
    """The simulator's random numbers (run_scenarios.mjs has the same): 32-bit xorshift."""
    x ^= (x << 13) & 0xFFFFFFFF
    x ^= x >> 17
    x ^= (x << 5) & 0xFFFFFFFF
    return x


class Sched:
    """The "sim" op's schedule (bench/simulate.py writes it): a virtual clock in whole
    milliseconds; each message is due a seeded delay after it was sent, never before the
    one sent before it on the same pair (FIFO, as a data channel); each compute a seeded
    time after the peer's previous one finished."""

    def __init__(self, e: dict):
        self.x = int(e["rng"]) or 1
        self.now = 0
        self.delay = e.get("delay_ms", [1, 50])
        self.compute = e.get("compute_ms", {})
        self.default = e.get("compute_default_ms", [5, 50])
        self.last: dict = {}   # (from, to) -> the last due time on that pair
        self.busy: dict = {}   # peer -> when its last compute finishes

    def draw(self, lo: int, hi: int) -> int:
        self.x = xorshift32(self.x)
        return lo + self.x % (hi - lo + 1)

    def message_due(self, sender: str, to: str) -> int:
        due = max(self.now + self.draw(*self.delay), self.last.get((sender, to), 0))
        self.last[(sender, to)] = due
        return due

    def compute_due(self, pid: str) -> int:
        due = max(self.now, self.busy.get(pid, 0)) + self.draw(*self.compute.get(pid, self.default))
        self.busy[pid] = due
        return due


class Net:
    def __init__(self, scenario: dict):
        self.sc = scenario
        self.rs = settings(scenario["settings"])
        self.luts = load_luts()
        self.peers: dict[str, R.RunPeer] = {}
        self.faults: dict[str, str] = {}
        self.last: dict[str, dict] = {}   # a stale liar's previous contribution
        self.dead: set[str] = set()
        self.held: set[str] = set()
        self.links: dict = {}           # (from, to) -> messages still let through (0: held)
        self.wire: deque = deque()      # (from, to, [frame bytes], due ms: the "sim" op's)
        self.computes: deque = deque()  # (peer, Compute, due ms)
        self.sim: Sched | None = None   # the "sim" op's schedule, while it runs
        self.reasm: dict = {}
        self.msg_no: dict[str, int] = {}
        self.snapshots: dict = {}
        self.out: list = []
        self.host = None                # the room's host, as the last room op said

    # -- outputs ---------------------------------------------------------------------------

    def feed(self, pid: str, outputs) -> None:
        for o in outputs:
            if isinstance(o, R.Send):
                msg = o.message
                fault = self.faults.get(pid)
                if fault and isinstance(msg, F.Contrib):
                    import dataclasses
                    msg = dataclasses.replace(msg, ints=corrupt(msg.ints, fault, msg.step,
                                                                self.last.setdefault(pid, {})))
                peer = self.peers[pid]
                m = F.to_message(msg, peer.run_id, peer.bounds)
                self.put(pid, o.to, m)
                continue
            self.out.append(norm_output(pid, o))
            if isinstance(o, R.Compute):
                self.computes.append((pid, o, self.sim.compute_due(pid) if self.sim else 0))
            elif isinstance(o, R.FetchData):
                self.feed(pid, self.peers[pid].data(self.rs.ds.to_bytes()))

    def put(self, sender: str, to: str, m: F.Message, meta_raw: str | None = None) -> None:
        no = self.msg_no.get(sender, 0)
        self.msg_no[sender] = no + 1
        if meta_raw is None:
            frames = F.encode_frames(m, no)
            self.out.append(["send", sender, to] + norm_message(m))
        else:  # hostile meta bytes, as written
            meta = meta_raw.encode()
            payload = len(meta).to_bytes(4, "little") + meta + bytes(m.body)
            frames = [F.HEADER.pack(F.MAGIC, F.VERSION, int(m.type), F._run_bytes(m.run_id),
                                    m.step, no, F.WHOLE, int(m.codec), 0, 0, 1, len(payload)) + payload]
            self.out.append(["send-raw", sender, to, body_sha(b"".join(frames))])
        if to in self.dead or sender in self.dead or to not in self.peers:
            return  # dead, or a stranger (an injected sender): nobody reads it
        self.wire.append((sender, to, frames, self.sim.message_due(sender, to) if self.sim else 0))

    # -- the network -----------------------------------------------------------------------

    def deliverable(self) -> int | None:
        """The first message on the wire whose link is not held (None: none)."""
        for i, (sender, to, _, _) in enumerate(self.wire):
            if self.links.get((sender, to)) != 0:
                return i
        return None

    def deliver_one(self, i: int | None = None) -> None:
        i = self.deliverable() if i is None else i
        sender, to, frames, _ = self.wire[i]
        del self.wire[i]
        if (sender, to) in self.links:
            self.links[(sender, to)] -= 1
        peer = self.peers[to]
        r = self.reasm.setdefault((sender, to), F.Reassembler())
        try:
            m = None
            for fr in frames:
                m = r.feed(fr)
            tr = peer.trainer
            msg = F.from_message(m, tr.total_size if tr else None, tr.state_sizes if tr else None)
        except F.FrameError as exc:
            self.reasm.pop((sender, to), None)
            n = len(self.out)
            self.feed(to, peer.bad_message(sender, str(exc)))
            for o in self.out[n:]:  # each side words its frame errors (tests/test_frames_*)
                if o[0] in ("log", "alarm"):
                    o[-1] = o[-1].replace(str(exc), "<frame error>")
            return
        self.feed(to, peer.receive(sender, msg, m.run_id))

    def compute_one(self, only: str | None = None, index: int | None = None) -> bool:
        for i, (pid, c, _) in enumerate(self.computes):
            if pid in self.held or (only is not None and pid != only) or (index is not None and i != index):
                continue
            del self.computes[i]
            tr = self.peers[pid].trainer
            res = R.contribute_at(tr, c.theta, c.step, c.micro)
            if res is not None:  # None: a local-steps round the room moved past, dropped (node.py)
                self.feed(pid, self.peers[pid].computed(c.step, c.task, res, c.term))
            return True
        return False

    def settle(self) -> None:
        for _ in range(MAX_ITER):
            if self.deliverable() is not None:
                self.deliver_one()
            elif not self.compute_one():
                return
        raise RuntimeError("the scenario did not settle")

    def live(self) -> list[str]:
        return sorted(p for p in self.peers if p not in self.dead)

    # -- ops -------------------------------------------------------------------------------

    def make_trainer(self, identity, ds):
        return build_trainer(ModelSpec.from_json(identity["model"]), Hyper(**identity["hyper"]), ds,
                       self.luts)

    def resolve(self, v, to: str):
        peer = self.peers.get(to)
        if isinstance(v, str) and v.startswith("$"):
            return {"$run": peer.run_id, "$sha": peer.member.sha() if peer.trainer else "0" * 64,
                    "$term": peer.term, "$step": peer.step,
                    "$identity": peer.run.identity if peer.run else {},
                    "$fingerprint": peer.trainer.ds.fingerprint if peer.trainer else "0" * 64}[v]
        if isinstance(v, dict):
            return {k: self.resolve(x, to) for k, x in v.items()}
        if isinstance(v, list):
            return [self.resolve(x, to) for x in v]
        return v

    def op(self, e: dict) -> None:
        kind = e["op"]
        if kind == "peer":
            pid = e["id"]
            kw = dict(capacity=float(e.get("capacity", 1.0)), verify_rate=float(e.get("verify_rate", 0.0)),
                      strikes=int(e.get("strikes", 3)), verify_key=e.get("verify_key", "key"),
                      window=e.get("window"), aggregate=e.get("aggregate", "star"))
            if "kind" in e:  # a member that says it is a tab (ring scenarios)
                kw["kind"] = e["kind"]
            if "selftest" in e:  # [passed, text]: what the peer's unit self-test found
                kw["selftest"] = (bool(e["selftest"][0]), str(e["selftest"][1]))
            if e.get("host"):
                self.peers[pid] = R.RunPeer(pid, trainer=build_trainer(self.rs.spec, self.rs.hp, self.rs.ds, self.luts),
                                            steps=int(e.get("steps", self.rs.steps)),
                                            wait_peers=int(e.get("wait_peers", 0)), **kw)
            else:
                make = self.make_trainer
                if "luts_sha" in e:  # a replica whose lookup tables differ (its identity says so)
                    def make(identity, ds, sha=str(e["luts_sha"])):
                        tr = self.make_trainer(identity, ds)
                        tr.identity = {**tr.identity, "luts": sha}
                        return tr
                self.peers[pid] = R.RunPeer(pid, make_trainer=make, **kw)
            if e.get("fault"):
                self.faults[pid] = e["fault"]
        elif kind == "room":
            self.host = e["host"]
            for pid in sorted(e.get("only", e["members"])):
                if pid not in self.dead:
                    self.feed(pid, self.peers[pid].room_changed(e["members"], e["host"]))
        elif kind == "link":
            ids = e["peers"]
            for i, a in enumerate(ids):
                for b in ids[i + 1:]:
                    self.feed(a, self.peers[a].channel_open(b))
                    self.feed(b, self.peers[b].channel_open(a))
        elif kind == "start":
            self.feed(e["id"], self.peers[e["id"]].start(float(e.get("now", self.sim.now / 1000 if self.sim else 0.0))))
        elif kind == "sim":
            self.simulate(e)
        elif kind == "run":
            self.settle()
        elif kind == "deliver":
            for _ in range(MAX_ITER):
                if self.deliverable() is None:
                    break
                self.deliver_one()
        elif kind == "compute":
            for _ in range(int(e.get("count", MAX_ITER))):
                if not self.compute_one(e.get("id")):
                    break
        elif kind == "hold":
            self.held.add(e["id"])
        elif kind == "release":
            self.held.discard(e["id"])
        elif kind == "hold_link":
            self.links[(e["from"], e["to"])] = int(e.get("after", 0))
        elif kind == "release_link":
            self.links.pop((e["from"], e["to"]), None)
        elif kind == "tick":
            for pid in self.live():
                self.feed(pid, self.peers[pid].tick(float(e["now"])))
        elif kind == "kill":
            pid = e["id"]
            self.dead.add(pid)
            self.wire = deque(w for w in self.wire if pid not in (w[0], w[1]))
            self.computes = deque(c for c in self.computes if c[0] != pid)
            if self.sim:
                self.sim.busy.pop(pid, None)
            for other in self.live():
                self.feed(other, self.peers[other].channel_closed(pid))
            if "host" in e:
                self.op({"op": "room", "members": self.live(), "host": e["host"]})
        elif kind == "inject":
            self.inject(e)
        elif kind == "snapshot":
            st = self.peers[e["id"]].trainer.state
            self.snapshots[e["name"]] = (st.step, st.theta.copy(), st.adam.m.copy(), st.adam.v.copy(),
                                         st.adam.b1t, st.adam.b2t)
        elif kind == "restore":
            step, theta, m, v, b1t, b2t = self.snapshots[e["name"]]
            from daisychain.engine.adam import AdamState
            adam = AdamState(m.copy(), v.copy(), step, b1t, b2t)
            self.feed(e["id"], self.peers[e["id"]].restore(step, theta.copy(), adam))
        else:
            raise ValueError(f"unknown op {kind}")

    def simulate(self, e: dict) -> None:
        """Run the room on the virtual clock until every live replica ended (or was
        refused) and every timed op ran, or ``until_ms`` passed (a hang): the next event is
        the earliest of the next timed op (``at``: [ms, op]), message, compute and tick, in
        that order on a tie. Appends ["sim", "end" | "hang", ms]."""
        s = self.sim = Sched(e)
        at, k = e.get("at", []), 0
        tick_ms, until = int(e.get("tick_ms", 100)), int(e["until_ms"])
        next_tick = tick_ms
        exit_ms, exits, seen = e.get("removed_exit_ms"), [], 0  # [due ms, peer]: a removed replica exits
        while True:
            if exit_ms:  # (as a daisy-peer does when it is told it was removed)
                for o in self.out[seen:]:
                    if o[0] == "removed" and o[1] not in self.dead and all(x[1] != o[1] for x in exits):
                        exits.append([s.now + s.draw(*exit_ms), o[1]])
                seen = len(self.out)
            if k == len(at) and all(p.ended or p.refused for q, p in self.peers.items()
                                    if q not in self.dead and p.trainer is not None):
                self.out.append(["sim", "end", s.now])
                break
            t_op = at[k][0] if k < len(at) else None
            t_exit = min((x[0] for x in exits), default=None)
            msg = min(((w[3], i) for i, w in enumerate(self.wire) if self.links.get((w[0], w[1])) != 0),
                      default=None)
            cmp = min(((c[2], i) for i, c in enumerate(self.computes) if c[0] not in self.held), default=None)
            t = min(x for x in (t_op, t_exit, msg and msg[0], cmp and cmp[0], next_tick) if x is not None)
            if t > until:
                self.out.append(["sim", "hang", s.now])
                break
            s.now = t
            for q in self.live():  # the shells bring the run's clock up to now before each input
                self.peers[q].now = max(self.peers[q].now, t / 1000)
            if t == t_op:
                k += 1
                self.op(at[k - 1][1])
            elif t == t_exit:
                x = min(exits)
                exits.remove(x)
                self.op({"op": "kill", "id": x[1], "host": self.host})
            elif msg is not None and t == msg[0]:
                self.deliver_one(msg[1])
            elif cmp is not None and t == cmp[0]:
                self.compute_one(index=cmp[1])
            else:
                next_tick += tick_ms
                for q in self.live():
                    self.feed(q, self.peers[q].tick(t / 1000))
        self.sim = None

    def inject(self, e: dict) -> None:
        """A message someone (maybe no member) writes: wire-form meta, with $run / $sha /
        $term / $step filled in from the receiver's view; "ints" computed honestly on the
        receiver's parameters (then corrupted by "fault")."""
        sender, to = e["from"], e["to"]
        meta = self.resolve(e.get("meta", {}), to)
        run_id = self.resolve(e.get("run_id", "$run"), to)
        step = self.resolve(e.get("step", "$step"), to)
        typ = F.FrameType[e.get("type", "control").upper()]
        body, codec = b"", F.Codec.NONE
        if "ints" in e:
            tr = self.peers[to].trainer
            spec = e["ints"]
            res = R.contribute_at(tr, tr.theta.copy(), step, spec["micro"])
            ints = res.grad
            if spec.get("fault"):
                ints = corrupt(ints, spec["fault"], step)
            if "slice" in spec:  # a ring chunk: values [lo, hi) of it
                ints = ints[spec["slice"][0]:spec["slice"][1]]
            if "set" in spec:  # [index, value]: "bound+1" / "-bound-1" (the clamp bound of its
                i, v = spec["set"]  # micro-batches), or an integer written as a string
                bound = len(spec["micro"]) * int(tr.limit)
                ints = np.array(ints, np.int64)
                ints[i] = {"bound+1": bound + 1, "-bound-1": -bound - 1}.get(v) or int(v)
            if spec.get("codec") == "RAW":  # as written, past every encoder check
                codec, body = F.Codec.RAW, np.asarray(ints, "<i8").tobytes()
            else:
                codec, body = F.encode_ints(ints, None if "slice" in spec else self.peers[to].bounds)
        if e.get("state"):  # the receiver's own state, under the step given (a STATE nobody asked for)
            st = self.peers[to].member.state()
            typ, meta = F.FrameType.STATE, {"params_sha256": st.params_sha256}
            body = F.encode_state(st.theta, st.m, st.v, st.b1t, st.b2t)
        m = F.Message(typ, run_id, step, meta, body, codec)
        self.put(sender, to, m, e.get("meta_raw"))


def run_scenario(scenario: dict) -> dict:
    net = Net(scenario)
    for e in scenario["events"]:
        net.op(e)
    final = {p: {"step": net.peers[p].step, "sha": net.peers[p].member.sha() if net.peers[p].trainer else None}
             for p in net.live()}
    return {"outputs": json.loads(json.dumps(net.out)), "final": final}

"""The runner of mixed rooms: the replicas of one scenario in both languages at once.

The Python replicas are scenario_net.py's; the JS ones live in one node process
(``run_scenarios.mjs --serve``: their RunPeers, frames and engine), stepped over a JSON-lines
pipe by this side's Net, which keeps the one schedule (the wire, the computes, the virtual
clock of the "sim" op). Every message crosses the real encoder of its sender's language and
the real reassembler and decoder of its receiver's (frame bytes in base64 on the pipe). The
outputs are the same normalised list as the pure runners', so a mixed run of a scenario must
write what a pure run of it writes (bench/simulate.py ``--lang mixed``).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from scenario_net import Net, settings

HERE = Path(__file__).resolve().parent


class Node:
    """The node process that hosts the JS replicas (one for many rooms: ``reset`` starts one)."""

    def __init__(self):
        from daisychain import package_path
        from daisychain.units.luts import default_dir
        self.proc = subprocess.Popen([shutil.which("node"), str(HERE / "run_scenarios.mjs"), "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.tmp = Path(tempfile.mkdtemp())
        self.runs: dict = {}   # run settings -> the reset request of its rooms
        self._write({"webui": str(package_path("webui")), "luts": str(default_dir())})

    def _write(self, q: dict) -> None:
        self.proc.stdin.write(json.dumps(q) + "\n")
        self.proc.stdin.flush()

    def ask(self, q: dict) -> dict:
        self._write(q)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the node side of the mixed room exited ({self.proc.poll()})")
        r = json.loads(line)
        if "error" in r:
            raise RuntimeError(f"js: {r['error']}")
        return r

    def reset(self, argv: tuple) -> None:
        if argv not in self.runs:
            from daisychain.engine.trainer import Trainer
            from daisychain.units import load_luts
            rs = settings(argv)
            dcds = self.tmp / f"run{len(self.runs)}.dcds"
            dcds.write_bytes(rs.ds.to_bytes())
            identity = Trainer(rs.spec, rs.hp, rs.ds, load_luts()).identity
            self.runs[argv] = {"m": "reset", "dcds": str(dcds), "identity": identity, "steps": rs.steps}
        self.ask(self.runs[argv])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)


class JsPeer:
    """A JS replica as scenario_net's Net sees a RunPeer: its methods ask the node side and
    answer its outputs (already normalised, sends with their frames); what the Net reads of a
    replica between inputs (ended, refused, a trainer, the step) is its state after the last."""

    def __init__(self, node: Node, pid: str):
        self.node, self.pid = node, pid
        self.now = 0.0
        self.ended = self.refused = False
        self.trainer = None
        self.step = 0

    def ask(self, q: dict) -> list:
        r = self.node.ask({**q, "id": self.pid, "now": self.now})
        st = r["st"]
        if st is not None:
            self.ended, self.refused, self.step = st["ended"], st["refused"], st["step"]
            self.trainer = True if st["trainer"] else None
        return r["out"]

    def _call(self, f: str, *a) -> list:
        return self.ask({"m": "call", "f": f, "a": list(a)})

    def op(self, e: dict) -> list:
        return self.ask({"m": "op", "e": e})

    def room_changed(self, members, host):
        return self._call("setMembers", members, host)

    def channel_open(self, other):
        return self._call("channelOpen", other)

    def channel_closed(self, other):
        return self._call("channelClosed", other)

    def tick(self, now):
        return self._call("tick", now)

    def start(self, now):
        return self.op({"op": "start", "id": self.pid, "now": now})

    def receive_frames(self, sender: str, frames: list) -> list:
        return self.ask({"m": "recv", "from": sender,
                         "frames": [base64.b64encode(bytes(f)).decode() for f in frames]})

    def compute(self, handle: int) -> list:
        return self.ask({"m": "compute", "h": handle})

    def final(self) -> dict:
        return self.node.ask({"m": "final", "id": self.pid})


class MixedNet(Net):
    """scenario_net's Net with the replicas named in ``js`` played by the node side."""

    def __init__(self, scenario: dict, js: set, node: Node):
        super().__init__(scenario)
        self.js, self.node = set(js), node
        self.crossed = {"py>js": 0, "js>py": 0}  # messages delivered from one language to the other
        node.reset(tuple(scenario["settings"]))

    def feed(self, pid: str, outputs) -> None:
        if pid not in self.js:
            return super().feed(pid, outputs)
        for item in outputs:  # in order: each send and compute draws its due time as it comes
            o = item["o"]
            self.out.append(o)
            if "f" in item:
                to = o[2]
                if to in self.dead or pid in self.dead or to not in self.peers:
                    continue
                frames = [base64.b64decode(f) for f in item["f"]]
                self.wire.append((pid, to, frames, self.sim.message_due(pid, to) if self.sim else 0))
            elif "h" in item:
                self.computes.append((pid, item["h"], self.sim.compute_due(pid) if self.sim else 0))

    def deliver_one(self, i: int | None = None) -> None:
        i = self.deliverable() if i is None else i
        sender, to, frames, _ = self.wire[i]
        if (sender in self.js) != (to in self.js):
            self.crossed["js>py" if sender in self.js else "py>js"] += 1
        if to not in self.js:
            return super().deliver_one(i)
        del self.wire[i]
        if (sender, to) in self.links:
            self.links[(sender, to)] -= 1
        self.feed(to, self.peers[to].receive_frames(sender, frames))

    def compute_one(self, only: str | None = None, index: int | None = None) -> bool:
        for i, (pid, c, _) in enumerate(self.computes):
            if pid in self.held or (only is not None and pid != only) or (index is not None and i != index):
                continue
            if pid not in self.js:
                return super().compute_one(only, i)
            del self.computes[i]
            self.feed(pid, self.peers[pid].compute(c))
            return True
        return False

    def op(self, e: dict) -> None:
        if e["op"] in ("peer", "snapshot", "restore") and e["id"] in self.js:
            if e["op"] == "peer":
                self.peers[e["id"]] = JsPeer(self.node, e["id"])
            self.feed(e["id"], self.peers[e["id"]].op(e))
        elif e["op"] == "inject" and e["to"] in self.js:
            raise ValueError("inject: the mixed runner plays the simulator's ops only")
        else:
            super().op(e)


def run_mixed(scenario: dict, js: set, node: Node) -> dict:
    """Play ``scenario`` with the replicas named in ``js`` in JS, the others in Python;
    the same result as scenario_net.run_scenario."""
    net = MixedNet(scenario, js, node)
    for e in scenario["events"]:
        net.op(e)
    final = {}
    for p in net.live():
        peer = net.peers[p]
        if p in net.js:
            final[p] = peer.final()
        else:
            final[p] = {"step": peer.step, "sha": peer.member.sha() if peer.trainer else None}
    return {"outputs": json.loads(json.dumps(net.out)), "final": final, "crossed": net.crossed}

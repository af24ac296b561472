"""A real daisy-peer that turns hostile (issue 35): ``python tests/hostile/attacker.py
DAISY-PEER-ARGS`` joins a room as daisy-peer does, trains honestly, and from its commit of
step ``DAISY_ATTACK_FROM`` (default 3) on writes one attack a step into its data channels, in
the order ``DAISY_ATTACKS`` names them (a comma list of :data:`ATTACKS`). Each attack is
logged to stderr as ``ATTACK <name> -> <peers>``.

The frames are the run protocol's own (frames.py), written in the attacker's name on the
channels the room gave it: what any approved member can send. Nothing here is in the
product; the product's side is daisychain/peer/run/ and the decoders.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import struct
import sys
import zlib

import numpy as np

from daisychain.peer import frames as F
from daisychain.peer import node as N
from daisychain.peer import run as R
from daisychain.peer.cli import main
from daisychain.peer.run.state import state_message

log = logging.getLogger("daisychain.peer")

#: the segment bomb: 11 million zero-length segment headers, 66 MB inflated, ~64 kB sent
BOMB_SEGMENTS = 11_000_000


def _bomb() -> bytes:
    z = zlib.compressobj(9)
    head = struct.pack("<IBB", 0, 0, 0) * 100_000
    parts = [z.compress(head) for _ in range(BOMB_SEGMENTS // 100_000)]
    return struct.pack("<I", BOMB_SEGMENTS) + b"".join(parts) + z.flush()


class Attacker(N.Node):
    attacks = [a for a in os.environ.get("DAISY_ATTACKS", "").split(",") if a]
    start = int(os.environ.get("DAISY_ATTACK_FROM", "3"))

    def _event(self, e) -> None:
        super()._event(e)
        if isinstance(e, R.Committed) and e.step >= self.start and self.attacks:
            name = self.attacks.pop(0)
            targets = ATTACKS[name](self)
            log.warning("ATTACK %s -> %s", name, ",".join(sorted(targets)))

    # -- helpers ---------------------------------------------------------------------------

    @property
    def coord(self) -> str:
        return self.run.member.coord

    def others(self) -> list[str]:
        return sorted(p for p in self.run.room if p not in (self.me, self.coord))

    def put(self, to: str, m: F.Message, allow_nan: bool = False) -> None:
        self.msg_no += 1
        self.mesh.send(to, F.encode_frames(m, self.msg_no, _allow_nan=allow_nan))

    def put_msg(self, to: str, msg) -> None:
        self.put(to, F.to_message(msg, self.run.run_id, self.run.bounds))

    # -- the attacks -----------------------------------------------------------------------

    def forged_run(self) -> list[str]:
        """A run announce of a term 10 higher in our own name, then an end of that term, to
        every member that is not the coordinator."""
        me, run = self.run.member, self.run.member.run
        term, step, sha = me.term + 10, me.step, me.sha()
        for to in self.others():
            self.put_msg(to, F.Run(run.identity, run.run_id, run.steps, term, step, sha, self.me,
                                   run.verify_rate, run.strikes))
            self.put_msg(to, F.End(term, step, sha))
        return self.others()

    def unasked_state(self) -> list[str]:
        """Our whole (valid) state under a step five ahead, to the coordinator, unasked."""
        st = dataclasses.replace(state_message(self.run.trainer), step=self.run.step + 5)
        self.put_msg(self.coord, st)
        return [self.coord]

    def sync_flood(self) -> list[str]:
        """1,000 sync requests to the coordinator and to every member."""
        me = self.run.member
        to = [self.coord, *self.others()]
        for p in to:
            for _ in range(1000):
                self.put_msg(p, F.SyncRequest(me.term, me.step, "f" * 64, "hash mismatch"))
        return to

    def min_int64(self) -> list[str]:
        """A contribution (RAW int64) whose first value is -2**63, to the coordinator."""
        ints = np.zeros(self.run.trainer.total_size, "<i8")
        ints[0] = np.iinfo(np.int64).min
        m = F.Message(F.FrameType.CONTRIB, self.run.run_id, self.run.step,
                      {"term": self.run.member.term, "task": 0, "micro": [0], "loss": 1.0,
                       "correct": 0}, ints.tobytes(), F.Codec.RAW)
        self.put(self.coord, m)
        return [self.coord]

    def segment_bomb(self) -> list[str]:
        """Two ~64 kB compressed contributions of 11 million segment headers each, to the
        coordinator and to every member."""
        body = _bomb()
        to = [self.coord, *self.others()]
        for p in to:
            for _ in range(2):
                self.put(p, F.Message(F.FrameType.CONTRIB, self.run.run_id, self.run.step,
                                      {"term": self.run.member.term, "task": 0, "micro": [0],
                                       "loss": 1.0, "correct": 0}, body, F.Codec.NARROW_Z))
        return to

    def frame_flood(self) -> list[str]:
        """20,000 small frames of no known message to every member but the coordinator (which
        would remove us after the run's strikes)."""
        to = self.others()
        m = F.Message(F.FrameType.CONTROL, self.run.run_id, self.run.step, {"t": "nonsense"})
        for p in to:
            for _ in range(20_000):
                self.put(p, m)
        return to

    def big_frame(self) -> list[str]:
        """One 64 MiB data-channel message (our own send limit lifted), to the coordinator."""
        link = self.mesh.links.get(self.coord)
        ch = link.channel if link else None
        if ch is None:
            return []
        ch.transport._remote_max_message_size = 128 << 20
        ch.send(b"\x07" * (64 << 20))
        return [self.coord]


ATTACKS = {"forged-run": Attacker.forged_run, "unasked-state": Attacker.unasked_state,
           "sync-flood": Attacker.sync_flood, "min-int64": Attacker.min_int64,
           "segment-bomb": Attacker.segment_bomb, "frame-flood": Attacker.frame_flood,
           "big-frame": Attacker.big_frame}


if __name__ == "__main__":
    unknown = [a for a in Attacker.attacks if a not in ATTACKS]
    if unknown:
        sys.exit(f"attacker: unknown attacks {unknown}; one of {', '.join(ATTACKS)}")
    N.Node = Attacker
    sys.exit(main())

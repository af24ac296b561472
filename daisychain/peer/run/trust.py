"""The trust role of the coordinator: spot-check verdicts (:func:`.checks.verdict`) on the
answers of the current step, strikes, the removal of a liar, and the rollback of the steps
its unchecked contributions went into (:mod:`.rollback`)."""

from __future__ import annotations

import numpy as np

from daisychain.engine.trainer import params_sha256
from daisychain.peer import frames as F
from daisychain.peer.run.checks import verdict
from daisychain.peer.run.outputs import Alarm, Log, Output, Send


class TrustRole:
    """The trust methods of :class:`~.coordinator.Coordinator` (its base class: the same
    object, the coordinator's attributes; a file of its own for one idea)."""

    def _open_for(self, j: int) -> list:
        return [t for t in self.tasks.values() if t.micro == (j,) and t.result is None and t.assignees]

    def _judge(self, j: int) -> list[Output]:
        """Compare the answers for spot-checked micro-batch ``j``, bit for bit. All equal
        (two or more, or one when nobody else can still answer): decided. Different: the
        coordinator's own answer is the reference: it computes it itself (the referee)."""
        c = self.checks.get(j)
        if c is None or c.decided is not None or not c.votes:
            return []
        what, arg = verdict({p: v[0] for p, v in c.votes.items()}, self.me, bool(self._open_for(j)),
                            c.refereed)
        if what == "decide":
            return self._decide(j, arg)
        if what == "wait":
            return []
        c.refereed = True
        out: list[Output] = [Log(f"spot-check of micro-batch {j} of step {self.step}: "
                                 f"{' and '.join(self._name(p) for p in arg)} differ; "
                                 "the coordinator computes it")]
        return out + self._dispatch([self._new_task(self.me, (j,), "referee")])

    def _decide(self, j: int, by: str) -> list[Output]:
        c = self.checks[j]
        c.decided, c.decided_by = c.votes[by], by
        ref = c.decided[0]
        out: list[Output] = []
        for peer, (ints, _, _) in sorted(c.votes.items()):
            if not np.array_equal(ints, ref):
                out += self._strike(peer, "mismatch", j,
                                    f"spot-check mismatch: {self._name(peer)} sent a wrong "
                                    f"contribution for micro-batch {j} of step {self.step} "
                                    f"(the reference is {self._name(by)}'s)")
        return out

    def _strike(self, peer: str, kind: str, micro: int | None, text: str) -> list[Output]:
        """One strike against ``peer``; at the run's ``strikes`` it is removed."""
        if peer == self.me or peer in self.banned:
            return [Log(text, loud=True)]
        n = self.strike_count[peer] = self.strike_count.get(peer, 0) + 1
        text = f"{text} (strike {n} of {self.strikes})"
        out: list[Output] = [Log(text, loud=True),
                             Alarm(kind, peer, self.names.get(peer, peer), self.step, micro, n, text)]
        if n >= self.strikes:
            out += self._remove(peer, n, text)
        return out

    def _remove(self, peer: str, n: int, last: str) -> list[Output]:
        """Remove a liar: it is told why and gets no more work or totals. The steps in the
        rollback window that hold an unchecked contribution of it are undone (the room goes
        back to the earliest and computes them again); unchecked ones older than the window
        are reported. Without any in the window, none of its answers of this step that a
        spot-check did not confirm is used (they are computed again)."""
        self.banned.add(peer)
        self.member.removed.add(peer)  # announced with every total: a new coordinator keeps it
        name = self.names.get(peer, peer)
        text = f"liar removed: {name} ({peer}) after {n} strikes"
        out: list[Output] = [Log(text, loud=True), Alarm("removed", peer, name, self.step, None, n, text)]
        if peer in self.open:
            why = f"{n} strikes (the last: {last})"[:1000]
            out.append(Send(peer, F.Refuse(self.term, (why,))))
        since = self.window.earliest(peer)
        first = self.unchecked_since.get(peer)
        if first is not None and (since is None or first < since):
            out.append(Log(f"liar {self._name(peer)} sent unchecked contributions from step {first} on, "
                           f"older than the rollback window ({self.window.size} steps, from step "
                           f"{self.window.first}): they stay in the model", loud=True))
        if since is not None:
            self.members.pop(peer, None)
            return out + self._roll_back(peer, since)
        for c in self.checks.values():  # a check that only its answer decided is open again
            if c.decided is not None and c.decided_by == peer and len(c.votes) < 2:
                c.decided = c.decided_by = None
        for t in self.tasks.values():
            if t.result is not None and t.result[0] == peer:
                c = self.checks.get(t.micro[0]) if len(t.micro) == 1 else None
                if c is None or c.decided is None:
                    t.result = None
        for c in self.checks.values():
            if c.decided is None:
                c.votes.pop(peer, None)
        return out + self.member_left(peer, quiet=True, force=True)

    def _tell_removed(self) -> list[Output]:
        """A new coordinator tells each removed liar still in the room again: the refuse of
        the one that removed it may have died with it, and it waited for ever (seed 676)."""
        why = ("removed from the run earlier (a caught liar): the new coordinator keeps it out",)
        return [Send(p, F.Refuse(self.term, why)) for p in sorted(self.banned)
                if p in self.open and p in self.room and p != self.me]

    def _holds_lies(self, state) -> list[Output]:
        """A restore to a state a rollback undid (a checkpoint saved before its liar was caught:
        the lies came back, seed 1338) is refused in one line; [] for any other state."""
        liar = self.window.tainted.get(params_sha256(state.theta[:self.trainer.layout.size]))
        if liar is None:
            return []
        return [Log(f"not restored: the checkpoint (step {state.step}) holds steps rolled back for "
                    f"liar {self._name(liar)}'s unchecked contributions", loud=True)]

    def _roll_back(self, peer: str, since: int) -> list[Output]:
        """Go back to the state before step ``since`` and compute again from there."""
        n = self.step - since
        self.window.go_back(self.trainer, since, peer)
        self.unchecked_since = {p: s for p, s in self.unchecked_since.items() if s < since}
        self.term += 1
        return self._reopen([Log(f"rolled back {n} step{'' if n == 1 else 's'}: liar {self._name(peer)} sent unchecked "
                                 f"contributions since step {since}", loud=True)])

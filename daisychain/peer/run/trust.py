"""The coordinator's trust in its members: spot-check verdicts (:func:`.checks.verdict`) on
the answers of the current step, strikes, the removal of a liar, and the rollback of the
steps its unchecked contributions went into (:mod:`.rollback`).

:class:`Trust` is one object that the :class:`~.coordinator.Coordinator` holds
(``coordinator.trust``) and delegates to. It owns the strikes, the removed list, the
rollback window and ``unchecked_since``; its answers are outputs. What a verdict or a
removal does to the step under way (a referee's task, a liar's open work given to the
others, a rollback's new term) it asks of the coordinator, whose book of the step
(``tasks``, ``checks``) it reads."""

from __future__ import annotations

import numpy as np

from daisychain.engine.trainer import params_sha256
from daisychain.peer import frames as F
from daisychain.peer.run.checks import verdict
from daisychain.peer.run.outputs import Alarm, Log, Output, Send


class Trust:
    """``strike_count`` (peer -> strikes), ``removed`` (the liars removed from the run, handed
    over), ``window`` (the rollback window: the member's, one object across terms),
    ``unchecked_since`` (peer -> its first step with an unchecked contribution)."""

    def __init__(self, coordinator, removed, window):
        self.c = coordinator
        self.strike_count: dict[str, int] = {}
        self.removed: set[str] = set(removed)
        self.use_window(window)

    def use_window(self, window) -> None:
        """Go on with ``window`` (a new coordinator's, a catch-up's, a restore's)."""
        self.window = window
        self.unchecked_since: dict[str, int] = window.unchecked_since()

    def record(self, step: int, total, unchecked, encoded=None) -> None:
        """Step ``step``'s committed ``total`` (``unchecked``: the peers whose contribution in
        it no spot-check confirmed) goes into the rollback window."""
        self.window.record(self.c.trainer, step, total, unchecked, encoded)
        for p in unchecked:
            self.unchecked_since.setdefault(p, step)

    def _open_for(self, j: int) -> list:
        return [t for t in self.c.tasks.values() if t.micro == (j,) and t.result is None and t.assignees]

    def judge(self, j: int) -> list[Output]:
        """Compare the answers for spot-checked micro-batch ``j``, bit for bit. All equal
        (two or more, or one when nobody else can still answer): decided. Different: the
        coordinator's own answer is the reference: it computes it itself (the referee)."""
        c = self.c
        check = c.checks.get(j)
        if check is None or check.decided is not None or not check.votes:
            return []
        what, arg = verdict({p: v[0] for p, v in check.votes.items()}, c.me, bool(self._open_for(j)),
                            check.refereed)
        if what == "decide":
            return self._decide(j, arg)
        if what == "wait":
            return []
        check.refereed = True
        out: list[Output] = [Log(f"spot-check of micro-batch {j} of step {c.step}: "
                                 f"{' and '.join(c._name(p) for p in arg)} differ; "
                                 "the coordinator computes it")]
        return out + c._dispatch([c._new_task(c.me, (j,), "referee")])

    def _decide(self, j: int, by: str) -> list[Output]:
        c = self.c
        check = c.checks[j]
        check.decided, check.decided_by = check.votes[by], by
        ref = check.decided[0]
        out: list[Output] = []
        for peer, (ints, _, _) in sorted(check.votes.items()):
            if not np.array_equal(ints, ref):
                out += self.strike(peer, "mismatch", j,
                                   f"spot-check mismatch: {c._name(peer)} sent a wrong "
                                   f"contribution for micro-batch {j} of step {c.step} "
                                   f"(the reference is {c._name(by)}'s)")
        return out

    def strike(self, peer: str, kind: str, micro: int | None, text: str) -> list[Output]:
        """One strike against ``peer``; at the run's ``strikes`` it is removed."""
        c = self.c
        if peer == c.me or peer in self.removed:
            return [Log(text, loud=True)]
        n = self.strike_count[peer] = self.strike_count.get(peer, 0) + 1
        text = f"{text} (strike {n} of {c.strikes})"
        out: list[Output] = [Log(text, loud=True),
                             Alarm(kind, peer, c.names.get(peer, peer), c.step, micro, n, text)]
        if n >= c.strikes:
            out += self._remove(peer, n, text)
        return out

    def _remove(self, peer: str, n: int, last: str) -> list[Output]:
        """Remove a liar: it is told why and gets no more work or totals. The steps in the
        rollback window that hold an unchecked contribution of it are undone (the room goes
        back to the earliest and computes them again); unchecked ones older than the window
        are reported. Without any in the window, none of its answers of this step that a
        spot-check did not confirm is used (they are computed again)."""
        c = self.c
        self.removed.add(peer)
        c.member.removed.add(peer)  # announced with every total: a new coordinator keeps it
        name = c.names.get(peer, peer)
        text = f"liar removed: {name} ({peer}) after {n} strikes"
        out: list[Output] = [Log(text, loud=True), Alarm("removed", peer, name, c.step, None, n, text)]
        if peer in c.open:
            why = f"{n} strikes (the last: {last})"[:1000]
            out.append(Send(peer, F.Refuse(c.term, (why,))))
        since = self.window.earliest(peer)
        first = self.unchecked_since.get(peer)
        if first is not None and (since is None or first < since):
            out.append(Log(f"liar {c._name(peer)} sent unchecked contributions from step {first} on, "
                           f"older than the rollback window ({self.window.size} steps, from step "
                           f"{self.window.first}): they stay in the model", loud=True))
        if since is not None:
            c.members.pop(peer, None)
            return out + self._roll_back(peer, since)
        for check in c.checks.values():  # a check that only its answer decided is open again
            if check.decided is not None and check.decided_by == peer and len(check.votes) < 2:
                check.decided = check.decided_by = None
        for t in c.tasks.values():
            if t.result is not None and t.result[0] == peer:
                check = c.checks.get(t.micro[0]) if len(t.micro) == 1 else None
                if check is None or check.decided is None:
                    # computed again by the others (member_left splits it as a task of the liar
                    # alone): its other assignees may have answered already, their answers
                    # dropped as duplicates, and would never be asked again (a hang: seed 87 of
                    # the tab-rollback rooms, tests/scenarios/sim_removed_liars_answer_reopened.json)
                    t.result = None
                    t.assignees = [peer]
        for check in c.checks.values():
            if check.decided is None:
                check.votes.pop(peer, None)
        return out + c.member_left(peer, quiet=True, force=True)

    def tell_removed(self) -> list[Output]:
        """A new coordinator tells each removed liar still in the room again: the refuse of
        the one that removed it may have died with it, and it waited for ever (seed 676)."""
        c = self.c
        why = ("removed from the run earlier (a caught liar): the new coordinator keeps it out",)
        return [Send(p, F.Refuse(c.term, why)) for p in sorted(self.removed)
                if p in c.open and p in c.room and p != c.me]

    def holds_lies(self, state) -> list[Output]:
        """A restore to a state a rollback undid (a checkpoint saved before its liar was caught:
        the lies came back, seed 1338) is refused in one line; [] for any other state."""
        liar = self.window.tainted.get(params_sha256(state.theta[:self.c.trainer.layout.size]))
        if liar is None:
            return []
        return [Log(f"not restored: the checkpoint (step {state.step}) holds steps rolled back for "
                    f"liar {self.c._name(liar)}'s unchecked contributions", loud=True)]

    def _roll_back(self, peer: str, since: int) -> list[Output]:
        """Go back to the state before step ``since`` and compute again from there (a new
        term: the coordinator reopens the room)."""
        c = self.c
        n = c.step - since
        self.window.go_back(c.trainer, since, peer)
        self.unchecked_since = {p: s for p, s in self.unchecked_since.items() if s < since}
        c.term += 1
        return c._reopen([Log(f"rolled back {n} step{'' if n == 1 else 's'}: liar {c._name(peer)} sent unchecked "
                              f"contributions since step {since}", loud=True)])

"""The catch-up role of the coordinator: bringing the replicas to one state. A member that
says it holds a later step is asked for its STATE only once a second member reports the
same step and hash, and that STATE is taken only from the member asked, at that step and
hash (a STATE nobody asked for is refused, a strike); with no confirmation the room goes on
from the coordinator's state. A member that fell behind or diverged asks (``sync``) and gets
the state once per term and step (docs/SECURITY.md, "A hostile member"). A restore (from a
checkpoint) or a rollback reopens the run on the coordinator's state in a new term."""

from __future__ import annotations

import numpy as np

from daisychain.engine.trainer import params_sha256
from daisychain.peer import frames as F
from daisychain.peer.run.outputs import Log, Output, RestoreError, Restored, Send, Setting
from daisychain.peer.run.state import checked_state

#: how long a coordinator waits for the STATE of a member that said it is ahead (and for a
#: second member to confirm that step)
SYNC_WAIT_S = 20.0
#: how long a restore (or a rollback) waits for the members to answer its new term
RESTORE_WAIT_S = 20.0


class CatchUpRole:
    """The catch-up methods of :class:`~.coordinator.Coordinator` (its base class: the same
    object, the coordinator's attributes; a file of its own for one idea)."""

    def on_state(self, sender: str, msg: F.State) -> list[Output]:
        """The STATE of a member that was ahead, asked for and confirmed by another member's
        report: take it and restart from there. A STATE nobody asked for is refused, and
        its sender struck."""
        if self.trainer is None:
            return []
        if sender not in self.asked_state:
            return self._refused_from(sender, f"refused a state (step {msg.step}) from "
                                              f"{self._name(sender)}: nobody asked for it")
        if not self.catching_up or sender != self.catch_from:
            return [Log(f"a state from {self._name(sender)} (step {msg.step}) after the room went "
                        f"on without it: ignored", loud=True)]
        if (msg.step, msg.params_sha256) != self.catch_report:
            return self._refused_from(sender, f"refused a state from {self._name(sender)}: step "
                                              f"{msg.step}, params {msg.params_sha256[:12]} is not "
                                              f"the step {self.catch_report[0]}, params "
                                              f"{self.catch_report[1][:12]} it reported")
        if params_sha256(msg.theta) != msg.params_sha256:
            return [Log(f"state from {sender} does not match its hash: ignored", loud=True)]
        if msg.step <= self.step:
            return []
        try:
            state = checked_state(self.trainer, msg.step, msg.theta, msg.m, msg.v, msg.b1t, msg.b2t)
        except RestoreError as exc:
            return [Log(f"state from {sender}: {exc}: ignored", loud=True)]
        self.member.load(state)
        self.pending.clear()
        return [Log(f"synced to step {msg.step} from {sender} "
                    f"(params {msg.params_sha256[:12]})")] + self._caught_up()

    def _refused_from(self, sender: str, text: str) -> list[Output]:
        """``text`` refuses what ``sender`` sent: a strike if it is a member of the run."""
        if sender in self.members and sender not in self.banned:
            return self.trust.strike(sender, "refused", None, text)
        return [Log(text, loud=True)]

    def _ahead(self, sender: str) -> list[Output]:
        """``sender`` reported a later step than ours. Its state is asked for once another
        member of the run reports the same step and hash (one member's word does not replace
        the run's state); with nobody left to confirm it, or none within SYNC_WAIT_S, the
        room goes on from ours and ``sender`` is brought to it."""
        m = self.members[sender]
        step, sha = m.ahead
        same = sorted(p for p, o in self.members.items()
                      if o.ahead == m.ahead and p != sender and p not in self.banned and not o.refused)
        if same and not self.catching_up:
            self.catching_up, self.catch_from, self.catch_report = True, sender, m.ahead
            self.catch_until = self.now + SYNC_WAIT_S
            self.asked_state.add(sender)
            return [Log(f"{sender} is ahead (step {step}, as {', '.join(same)} reports too): taking its state"),
                    Send(sender, F.SyncRequest(self.term, self.step, self._hash(), "coordinator behind"))]
        if same:
            return []
        could = [p for p in self.room if p not in (self.me, sender) and p not in self.banned
                 and not (p in self.members and self.members[p].refused)]
        if not could:
            return self._unconfirmed(sender)
        return [Log(f"{sender} says it is ahead (step {step}, params {sha[:12]}); no other member "
                    f"reports it yet: waiting up to {SYNC_WAIT_S:g} s for one")]

    def _unconfirmed(self, sender: str) -> list[Output]:
        """Nobody confirmed ``sender``'s later step: go on from ours and bring it to it."""
        m = self.members[sender]
        step, m.ahead = m.ahead[0], None
        m.synced = True
        return [Log(f"no other member confirms step {step} of {self._name(sender)}: going on from "
                    f"step {self.step} and sending it the state", loud=True),
                Send(sender, self._state())] + self._maybe_begin()

    def _caught_up(self) -> list[Output]:
        """The coordinator took the state of a member that was ahead: restart from there."""
        self.catching_up = False
        self.tasks.clear()
        self.checks.clear()
        self.step_started = False
        self.aggregation.drop()
        self._new_window()
        for m in self.members.values():
            m.synced, m.ahead = False, None
        return [Send(p, self._announce()) for p in self._announce_targets()]

    def on_syncrequest(self, sender: str, msg: F.SyncRequest) -> list[Output]:
        """A member that fell behind or diverged asks for the state: answered once per member,
        term and step (an honest member needs no more), and only when it can be true (a
        member of the run, this term, not already on our step and hash); anything else costs
        nothing. A diverged member may be ahead of us (it applied a total that was not ours)."""
        m = self.members.get(sender)
        if self.trainer is None or m is None or sender in self.banned or msg.term != self.term:
            return []
        if msg.step == self.step and msg.params_sha256 == self._hash():
            return []
        if m.answered == (self.term, self.step):
            return []
        m.answered = (self.term, self.step)
        out: list[Output] = []
        if msg.reason != "coordinator behind":
            out.append(Log(f"{sender} diverged at step {msg.step} (params {msg.params_sha256[:12]}, "
                           f"{msg.reason}): resyncing it", loud=True))
        return out + [Send(sender, self._state())] + self.aggregation.resend(sender)

    def _check_catch_up(self) -> list[Output]:
        """A member that said it is ahead sent no usable STATE in SYNC_WAIT_S (it never
        answered, or its state was refused), or nobody confirmed its step in that time: go on
        from ours and bring it to it."""
        out: list[Output] = []
        for p in sorted(self.members):
            m = self.members[p]
            if m.ahead is not None and self.now >= m.ahead_until and p not in self.banned \
                    and not m.refused and not (self.catching_up and p == self.catch_from):
                out += self._unconfirmed(p)
        if not self.catching_up or self.now < self.catch_until:
            return out
        self.catching_up = False
        peer, m = self.catch_from, self.members.get(self.catch_from)
        out.append(Log(f"{self._name(peer)} sent no state in {SYNC_WAIT_S:g} s: going "
                       f"on from step {self.step}", loud=True))
        if m is not None:
            m.ahead = None
        if m is not None and m.ready and not m.refused and peer not in self.banned:
            m.synced = True
            out.append(Send(peer, self._state()))
        return out

    def restore(self, step: int, theta: np.ndarray, adam, params_sha256: str | None = None,
                source: str = "a checkpoint", steps: int | None = None) -> list[Output]:
        """The coordinator restores the whole room from a checked state (``adam``: an
        ``AdamState``): it loads it, opens a new term (open work is dropped) and sends each
        member ``restore`` + STATE + ``run``; training continues from ``step`` (to ``steps``,
        the run's total, if given). Raises
        RestoreError when the state does not fit the run."""
        state = checked_state(self.trainer, step, theta, adam.m, adam.v, adam.b1t, adam.b2t,
                              params_sha256)
        if refused := self.trust.holds_lies(state):
            return refused
        self.member.load(state)
        settings = []
        if steps is not None:
            self.steps = int(steps)
            settings.append(Setting("steps", self.steps))
        self._new_window()
        self.term += 1
        sha = self._hash()
        return settings + self._reopen([Log(f"restored the room from {source}: step {step}, params {sha[:12]} "
                                 f"(term {self.term})"), Restored(int(step), sha, self.me)])

    def _reopen(self, out: list[Output]) -> list[Output]:
        """A new term (already counted) on a state the coordinator loaded (a restore, a
        rollback): open work is dropped; each member gets ``restore`` + STATE + ``run``."""
        self.restored_term = self.term
        self.tasks, self.step_started, self.catching_up, self.ended = {}, False, False, False
        self.checks = {}
        self.pending.clear()
        self.aggregation.drop()
        for mem in self.members.values():
            mem.ready = mem.synced = False
        targets = self._announce_targets()
        self.wait_for, self.wait_until = set(targets), self.now + RESTORE_WAIT_S
        state, announce = self._state(), self._announce()
        restore = F.Restore(self.term, self.step, state.params_sha256)
        for p in targets:  # a member that never joined gets the state when it answers `run`
            if p in self.members and not self.members[p].refused:
                out += [Send(p, restore), Send(p, state)]
            out.append(Send(p, announce))
        return out + self._maybe_begin()

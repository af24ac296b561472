"""The member role: follow the coordinator that announced the run, compute the tasks it
assigns, apply each step's total and compare hashes, take a STATE when behind or restored,
and leave when removed."""

from __future__ import annotations

from daisychain.engine.trainer import identity_differences, params_sha256
from daisychain.peer import frames as F
from daisychain.peer.run.outputs import (
    Committed, Compute, Ended, FetchData, Log, Output, Refused, Removed, RestoreError, Restored, Send)
from daisychain.peer.run.split import measure_capacity
from daisychain.peer.run.state import checked_state, load_state, tensor_bounds


class MemberRole:
    """Mixed into :class:`~.driver.RunPeer`: the handlers of what a coordinator sends."""

    def _on_run(self, sender: str, msg: F.Run) -> list[Output]:
        if self.refused or self.coordinating or msg.term < self.term or (
                msg.term == self.term and sender != self.coord):
            return []
        self.coord = sender
        self.steps = msg.steps
        self.verify_rate, self.strikes = msg.verify_rate, msg.strikes
        first = self.run is None or msg.run_id != self.run.run_id
        if first or msg.term != self.term:
            self.pending.clear()  # (the same announce again, on a reopened channel: work goes on)
            self._ring_drop()  # ring hook
        self.term, self.run = msg.term, msg
        self.ended = False
        if self.trainer is not None and not first:
            return [Send(sender, self._ready())]
        if self.trainer is not None and first:  # another run (ours ended): start over from its data
            self.trainer, self.bounds = None, None
        self.awaiting_data = True
        return [FetchData(str(msg.identity.get("task", "")), str(msg.identity.get("dataset", "")))]

    def _prepared(self, ds) -> list[Output]:
        try:
            self.trainer = self.make_trainer(self.run.identity, ds)
        except Exception as exc:  # noqa: BLE001 - a run we cannot build is refused, in words
            return self._refuse([f"cannot build the run here: {exc}"])
        self.bounds = tensor_bounds(self.trainer)
        return self._check_identity()

    def _check_identity(self) -> list[Output]:
        reasons = identity_differences(self.trainer.identity, self.run.identity)
        if not self.selftest[0]:
            reasons.append(f"self-test failed: {self.selftest[1]}")
        if reasons:
            return self._refuse(reasons)
        if self.capacity is None:
            self.capacity = measure_capacity(self.trainer)
        return [Log(f"joined run {self.run.run_id} (step {self.run.step} of {self.run.steps})"),
                Send(self.coord, self._ready())]

    def _ready(self) -> F.Ready:
        return F.Ready(self.term, float(self.capacity or 1.0), self.kind, self.step, self._hash())

    def _refuse(self, reasons: list[str]) -> list[Output]:
        self.refused = True
        out: list[Output] = [Refused(self.me, tuple(reasons))]
        if self.coord and self.coord != self.me:
            out.insert(0, Send(self.coord, F.Refuse(self.term, tuple(reasons))))
        return out

    def _on_assign(self, sender: str, msg: F.Assign) -> list[Output]:
        if self.coordinating or sender != self.coord or msg.term != self.term or self.trainer is None:
            return []
        if msg.step != self.step:
            return []
        out: list[Output] = []
        for t in msg.tasks:
            if t.peer == self.me and (msg.step, t.task) not in self.pending:
                self.pending[(msg.step, t.task)] = t.micro
                out.append(Compute(msg.step, t.task, t.micro, self.trainer.theta.copy()))
        return out

    def _on_total(self, sender: str, msg: F.Total) -> list[Output]:
        if self.coordinating or sender != self.coord or self.trainer is None:
            return []
        if msg.step < self.step:
            return []
        if msg.step > self.step:
            return [Log(f"missed steps {self.step}..{msg.step - 1}: resyncing", loud=True),
                    Send(sender, F.SyncRequest(self.term, self.step, self._hash(), "behind"))]
        out = self._apply(msg.ints, msg.loss, msg.contributors, msg.params_sha256, sender)
        if msg.tasks and msg.term == self.term and self._hash() == msg.params_sha256:
            # the next step's tasks, started the moment the total is applied (not on a
            # replica that just diverged: it waits for its STATE; a backup takes the task)
            out += self._on_assign(sender, F.Assign(msg.term, msg.step + 1, msg.tasks))
        return out

    def _on_state(self, sender: str, msg: F.State) -> list[Output]:
        if self.trainer is None or (sender != self.coord and not self.coordinating):
            return []
        restore, self.restoring = (self.restoring, None) if not self.coordinating else (None, None)
        if params_sha256(msg.theta) != msg.params_sha256:
            return [Log(f"state from {sender} does not match its hash: ignored", loud=True)]
        if restore is not None and restore != (msg.step, msg.params_sha256):
            return [Log(f"restore from {sender}: the state (step {msg.step}, params "
                        f"{msg.params_sha256[:12]}) is not the announced checkpoint (step "
                        f"{restore[0]}, params {restore[1][:12]}): ignored", loud=True)]
        if self.coordinating and msg.step <= self.step:
            return []
        try:
            state = checked_state(self.trainer, msg.step, msg.theta, msg.m, msg.v, msg.b1t, msg.b2t)
        except RestoreError as exc:
            return [Log(f"state from {sender}: {exc}: ignored", loud=True)]
        load_state(self.trainer, state)
        self.pending.clear()
        out: list[Output] = [Log(f"synced to step {msg.step} from {sender} "
                                 f"(params {msg.params_sha256[:12]})")]
        if restore is not None:
            out.append(Restored(msg.step, msg.params_sha256, sender))
        if self.coordinating:  # caught up with a member that was ahead: restart from there
            return out + self._caught_up()
        return out + self._ring_synced()  # ring hook: a held ring plan of this step starts

    def _on_restore(self, sender: str, msg: F.Restore) -> list[Output]:
        """The coordinator restored the room: the STATE that follows replaces ours."""
        if self.refused or self.coordinating or self.trainer is None or msg.term < self.term:
            return []
        if sender not in (self.coord, self.host):
            return [Log(f"a restore from {sender}, who does not coordinate the run: ignored", loud=True)]
        self.coord, self.term = sender, msg.term
        self.restoring = (msg.step, msg.params_sha256)
        self.pending.clear()
        self.ended = False
        return [Log(f"{sender} restores the room from a checkpoint: step {msg.step}, "
                    f"params {msg.params_sha256[:12]}")]

    def _on_end(self, sender: str, msg: F.End) -> list[Output]:
        if sender != self.coord or self.trainer is None or self.ended:
            return []
        if self._ring_holds_end(msg):  # ring hook: our ring's last total is still gathering
            return []
        self.ended = True
        return [Ended(msg.step, self._hash(), self._hash() == msg.params_sha256 and msg.step == self.step)]

    def _on_data(self, sender: str, msg: F.Data) -> list[Output]:
        if sender != self.coord:
            return []
        return self.data(msg.data) if self.awaiting_data else []


    def _committed(self, step, loss, contributors, sha) -> list[Output]:
        for peer, n in contributors:
            self.done_by[peer] = self.done_by.get(peer, 0) + n
        mine = dict(contributors).get(self.me, 0)
        return [Committed(step, loss, contributors, mine, sha)]

    def _apply(self, ints, loss, contributors, sha, sender) -> list[Output]:
        step = self.step
        self.trainer.apply(ints)
        self.pending = {k: v for k, v in self.pending.items() if k[0] > step}
        out = self._committed(step, loss, contributors, sha)
        mine = self._hash()
        if mine != sha:
            out.append(Log(f"PARAMETER HASH MISMATCH after step {step}: {mine[:16]} here, "
                           f"{sha[:16]} at the coordinator: resyncing", loud=True))
            out.append(Send(sender, F.SyncRequest(self.term, self.step, mine, "hash mismatch")))
        return out


    def _member_on_refuse(self, sender: str, msg: F.Refuse) -> list[Output]:
        """The coordinator removed this replica from the run (``reasons``: why)."""
        if sender != self.coord or self.refused:
            return []
        self.refused = self.ended = True
        self.pending.clear()
        reason = "; ".join(msg.reasons)
        return [Log(f"removed from the run by {self._name(sender)}: {reason}", loud=True),
                Removed(sender, reason)]

"""The member role: the replica (its trainer and the run it follows). Follow the coordinator
that announced the run, compute the tasks it assigns, apply each step's total and compare
hashes, take a STATE when behind or restored, serve its state and dataset to whoever asks,
and leave when removed. While this peer coordinates, its :class:`~.coordinator.Coordinator`
reads the replica through :class:`Member`'s narrow interface (``trainer``, ``bounds``,
``step``, ``sha()``, ``load()``, ``committed()``, ``state()``); the member itself then only
serves the run's dataset."""

from __future__ import annotations

import numpy as np

from daisychain.engine.model import Result
from daisychain.engine.trainer import Trainer, TrainState, identity_differences, params_sha256
from daisychain.peer import frames as F
from daisychain.peer.run.aggregator import MemberAggregation
from daisychain.peer.run.outputs import (
    Committed, Compute, Ended, FetchData, Log, Output, Refused, Removed, RestoreError, Restored, Send,
    Setting)
from daisychain.peer.run.ring_roles import RingMember
from daisychain.peer.run.rollback import Window, window_steps
from daisychain.peer.run.split import measure_capacity
from daisychain.peer.run.state import checked_state, load_state, state_message, tensor_bounds



#: how long a run announce from a peer that the signaling server has not named the room's
#: host is held (its announce may overtake the server's room message at a hand-over) before
#: it is refused and its sender struck
HOLD_S = 20.0


class Member:
    """The replica of this peer and the handlers of what a coordinator sends. ``peer``: the
    run context (:mod:`.context`: the driver's settings, room, names, clock; read-only)."""

    def __init__(self, peer, trainer: Trainer | None = None):
        self.peer = peer
        self.trainer = trainer
        self.bounds = tensor_bounds(trainer) if trainer else None
        self.term = 0
        self.run: F.Run | None = None     # the announce we follow
        self.coord: str | None = None     # the coordinator whose announce we follow
        self.ended = False
        self.refused = False
        self.pending: dict[tuple[int, int], tuple[int, ...]] = {}  # (step, task) -> micro
        self.awaiting_data = False
        self.restoring: tuple[int, str] | None = None  # (step, hash) a restore announced
        #: its side of each step's sum (aggregator.py): its part in a ring, else the star's
        self.aggregation: MemberAggregation = RingMember(self)
        #: the rollback window of this replica (rollback.py): kept by every member, so that a
        #: coordinator built from it (hand-over) can roll back lies from before its term
        self.window: Window | None = None
        self.removed: set[str] = set()  # peers removed from the run (liars), as announced
        # who coordinates is the server's word: a run announce from a peer it has not named
        # the room's host waits here (the latest per sender, until HOLD_S after the first)
        self.held: dict[str, tuple[F.Run, float]] = {}
        self.struck: set[str] = set()     # peers whose held announce the server never confirmed
        # named host without the run, its coordinator gone: the announces members forward
        # (sender -> (announce, when it came)); followed once two agree (forwarded())
        self.forwards: dict[str, tuple[F.Run, float]] = {}
        self.forwarded_to: str | None = None  # the new host we forwarded our announce to
        self.answered: tuple[int, int] | None = None  # (term, step) of the last STATE we sent
        self.data_sent: set[str] = set()  # peers sent the run's dataset
        if trainer is not None:  # the host of a new room: the run is ours
            self.run = F.Run(trainer.identity, trainer.run_id, peer.steps, 0, self.step, self.sha(),
                             peer.me, peer.verify_rate, peer.strikes)

    # -- the narrow interface a coordinator reads the replica through ---------------------

    @property
    def step(self) -> int:
        return self.trainer.state.step if self.trainer else 0

    def sha(self) -> str:
        return self.trainer.params_sha256()

    def state(self) -> F.State:
        """This replica's whole state as a STATE message."""
        return state_message(self.trainer)

    def load(self, state: TrainState) -> None:
        """Take a whole checked state (the one state loader, :mod:`.state`). The rollback
        window keeps the steps before it if it leads to it (a restore mid-window)."""
        load_state(self.trainer, state)
        self.pending.clear()
        if self.window is None:
            self.window_for()
        else:
            self.window.rebase(self.trainer)

    def window_for(self) -> Window:
        """This replica's rollback window, made at its first use in a run (from the state
        then): the coordinator's too while this peer coordinates (one object)."""
        if self.window is None:
            size = self.peer.window_size
            if size is None:
                size = window_steps(self.peer.verify_rate, self.peer.strikes)
            self.window = Window(size, self.bounds)
            self.window.reset(self.trainer)
        return self.window

    def committed(self, step, loss, contributors, sha) -> list[Output]:
        """A step was committed (applied here): who did what (the driver counts it)."""
        mine = dict(contributors).get(self.peer.me, 0)
        return [Committed(step, loss, contributors, mine, sha)]

    # -- hand-over ---------------------------------------------------------------------------

    def lead(self) -> None:
        """This peer starts coordinating: its own tasks as a member are dropped."""
        self.coord = self.peer.me
        self.pending.clear()
        self.aggregation.drop()  # the coordinator's sum is its own
        self.restoring = None

    def follow_after(self, coordinator) -> None:
        """This peer's coordinator was dropped: the member goes on from its term and announce
        (a new host's announce has a later term)."""
        self.term, self.run, self.ended = coordinator.term, coordinator.run, coordinator.ended

    # -- inputs ------------------------------------------------------------------------------

    def computed(self, step: int, task: int, result: Result, term: int | None = None) -> list[Output]:
        if term is not None and term != self.term:
            return []  # asked in an older term: the same task number may now be another task
        micro = self.pending.pop((step, task), None)
        if micro is None or self.ended or self.coord is None or step != self.step:
            return []
        loss = float(np.sum(result.loss)) if len(result.loss) else 0.0
        correct = int(np.sum(result.correct))
        return self.aggregation.computed(step, task, micro, result.grad, loss, correct)

    def data(self, blob: bytes | None) -> list[Output]:
        """The dataset fetch finished (``None``: failed)."""
        from daisychain.engine.data import DataError, Dataset
        if not self.awaiting_data or self.run is None:
            return []
        want = self.run.identity.get("dataset")
        if blob is not None:
            import hashlib
            if hashlib.sha256(blob).hexdigest() == want:
                self.awaiting_data = False
                try:
                    ds = Dataset.from_bytes(blob)
                except DataError as exc:
                    return self._refuse([f"dataset: {exc}"])
                return self._prepared(ds)
        if self.coord and self.coord != self.peer.me:  # ask the coordinator over the channel
            return [Log("the server has no matching dataset; asking the coordinator"),
                    Send(self.coord, F.DataRequest(want))]
        return self._refuse(["dataset fingerprint: no copy of the run's dataset found"])

    def on_run(self, sender: str, msg: F.Run, handed: str | None = None) -> list[Output]:
        """``handed``: the host named before, when :meth:`_forwarded` just took it to be
        ``sender`` (its Setting is not applied yet)."""
        # (the current term from another sender only when the server names it host: two
        # members that took over one after the other from the same term both announce term + 1)
        if self.refused or msg.term < self.term or (msg.term == self.term and sender != self.coord
                                                     and sender != self.peer.host):
            return []
        # named host before it held the run: it follows the host named before it to get the
        # replica, then leads (driver._lead_if_named); nobody coordinated before (the old host
        # had stepped down, every member held its announce)
        before = handed if handed is not None else self.peer.prev_host
        handing = self.peer.host == self.peer.me and self.trainer is None and sender == before
        if self.peer.host == self.peer.me and self.run is None and not handing \
                and msg.coordinator not in self.peer.room:
            return self._forwarded(sender, msg)
        if sender != self.peer.host and not (msg.term == self.term and sender == self.coord) and not handing:
            return self._hold(sender, msg)
        self.held.pop(sender, None)
        if sender != self.coord:  # a restore announced by the one before is void (it died before
            self.restoring = None  # its STATE came, and the new host's state was ignored: seed 5559)
        self.coord = sender
        settings = [Setting("steps", msg.steps), Setting("verify_rate", msg.verify_rate),
                    Setting("strikes", msg.strikes)]
        first = self.run is None or msg.run_id != self.run.run_id
        if first:  # another run: its own window and removed list
            self.window, self.removed = None, set()
        self.removed |= set(msg.removed)
        if first or msg.term != self.term:
            self.pending.clear()  # (the same announce again, on a reopened channel: work goes on)
            self.aggregation.drop()
        self.term, self.run = msg.term, msg
        self.ended = False
        if self.trainer is not None and not first:
            return settings + [Send(sender, self._ready())]
        if self.trainer is not None and first:  # another run (ours ended): start over from its data
            self.trainer, self.bounds = None, None
        self.awaiting_data = True
        return settings + [FetchData(str(msg.identity.get("task", "")), str(msg.identity.get("dataset", "")))]

    def _hold(self, sender: str, msg: F.Run) -> list[Output]:
        """A run announce from a peer that the server has not named the room's host: held
        until the server names it (a hand-over's announce can overtake the room message),
        refused when it does not within HOLD_S."""
        if sender not in self.peer.room:
            return [Log(f"a run announce from {self.peer._name(sender)}, who is not in the room: "
                        f"refused", loud=True)]
        first = sender not in self.held
        until = self.peer.now + HOLD_S if first else self.held[sender][1]
        self.held[sender] = (msg, until)
        if not first or sender in self.struck:
            return []
        return [Log(f"a run announce (term {msg.term}) from {self.peer._name(sender)}, whom the "
                    f"server has not named the room's host (it names {self.peer.host}): held "
                    f"until it does", loud=True)]

    def _forwarded(self, sender: str, msg: F.Run, follow: bool = False) -> list[Output]:
        """This peer is the named host, holds no run, and the coordinator of ``msg`` left: a
        member forwarded the announce it follows (:meth:`host_named`). Followed (then led,
        driver._lead_if_named) once two members forwarded the same run, or the sender is the
        only other member, or HOLD_S passed with no other run forwarded (:meth:`tick`); so one
        hostile member cannot make the new host lead a run of its own making. Before, nobody
        could lead: the host died before the one it named held the run (seeds 1255, 1786)."""
        if sender not in self.peer.room or sender == self.peer.me:
            return []
        self.forwards.setdefault(sender, (msg, self.peer.now))
        same = [p for p, (m, _) in self.forwards.items() if m.run_id == msg.run_id]
        others = self.peer.room - {self.peer.me}
        if not (follow or len(same) >= 2 or others == {sender}):
            return []
        self.forwards.clear()
        # (on_run's hand-over from the host before: this one)
        return [Setting("prev_host", sender),
                Log(f"the coordinator {msg.coordinator} left before this peer held the run: "
                    f"following its announce from {self.peer._name(sender)} to lead")] + \
            self.on_run(sender, msg, handed=sender)

    def host_named(self) -> list[Output]:
        """The signaling room changed: a held announce of the host it names is followed now;
        those of peers that left are dropped. When the coordinator we follow left and the
        server names another host, that host gets our announce (it may not hold the run:
        the coordinator died before it announced to it)."""
        for peer in [p for p in self.held if p not in self.peer.room]:
            del self.held[peer]
        held = self.held.pop(self.peer.host, None) if self.peer.host else None
        if held:
            return self.on_run(self.peer.host, held[0])
        host = self.peer.host
        if host == self.peer.me and self.run is None:  # forwards that came before the room said so
            out: list[Output] = []
            for peer, (msg, _) in list(self.held.items()):
                if msg.coordinator not in self.peer.room and self.run is None:
                    del self.held[peer]
                    out += self._forwarded(peer, msg)
            return out
        if self.run is not None and self.trainer is not None and not self.refused and host \
                and host != self.peer.me and host != self.coord and self.coord not in self.peer.room \
                and host != self.forwarded_to:
            self.forwarded_to = host
            return [Send(host, self.run)]
        return []

    def tick(self) -> list[Output]:
        """Held announces the server did not confirm within HOLD_S: refused, and their
        senders struck (their announces are ignored, unless the server names them host)."""
        out: list[Output] = []
        runs = {m.run_id for m, _ in self.forwards.values()}
        if len(runs) == 1 and self.run is None and self.peer.now >= min(
                t for _, t in self.forwards.values()) + HOLD_S:
            first = min(self.forwards, key=lambda p: (self.forwards[p][1], p))
            out += self._forwarded(first, self.forwards[first][0], follow=True)
        for peer, (msg, until) in list(self.held.items()):
            if self.peer.now >= until and peer not in self.struck:
                self.struck.add(peer)
                out.append(Log(f"refused a run announce (term {msg.term}) from "
                               f"{self.peer._name(peer)}: the server did not name it the room's "
                               f"host within {HOLD_S:g} s; {peer} is struck (its announces are "
                               f"ignored while the server names another host)", loud=True))
        return out

    def _prepared(self, ds) -> list[Output]:
        try:
            self.trainer = self.peer.make_trainer(self.run.identity, ds)
        except Exception as exc:  # noqa: BLE001 - a run we cannot build is refused, in words
            return self._refuse([f"cannot build the run here: {exc}"])
        self.bounds = tensor_bounds(self.trainer)
        return self._check_identity()

    def _check_identity(self) -> list[Output]:
        reasons = identity_differences(self.trainer.identity, self.run.identity)
        if not self.peer.selftest[0]:
            reasons.append(f"self-test failed: {self.peer.selftest[1]}")
        if reasons:
            return self._refuse(reasons)
        out: list[Output] = []
        capacity = self.peer.capacity
        if capacity is None:
            capacity = measure_capacity(self.trainer)
            out.append(Setting("capacity", capacity))
        return out + [Log(f"joined run {self.run.run_id} (step {self.run.step} of {self.run.steps})"),
                      Send(self.coord, self._ready(capacity))]

    def _ready(self, capacity: float | None = None) -> F.Ready:
        capacity = self.peer.capacity if capacity is None else capacity
        return F.Ready(self.term, float(capacity or 1.0), self.peer.kind, self.step, self.sha())

    def _refuse(self, reasons: list[str]) -> list[Output]:
        self.refused = True
        out: list[Output] = [Refused(self.peer.me, tuple(reasons))]
        if self.coord and self.coord != self.peer.me:
            out.insert(0, Send(self.coord, F.Refuse(self.term, tuple(reasons))))
        return out

    def on_assign(self, sender: str, msg: F.Assign) -> list[Output]:
        if sender != self.coord or msg.term != self.term or self.trainer is None:
            return []
        if msg.step != self.step:
            return []
        out: list[Output] = []
        for t in msg.tasks:
            if t.peer == self.peer.me and (msg.step, t.task) not in self.pending:
                self.pending[(msg.step, t.task)] = t.micro
                out.append(Compute(msg.step, t.task, t.micro, self.trainer.theta.copy(), self.term))
        return out

    def on_total(self, sender: str, msg: F.Total) -> list[Output]:
        if sender != self.coord or self.trainer is None:
            return []
        if msg.step < self.step:
            return []
        if msg.step > self.step:
            return [Log(f"missed steps {self.step}..{msg.step - 1}: resyncing", loud=True),
                    Send(sender, F.SyncRequest(self.term, self.step, self.sha(), "behind"))]
        self.removed |= set(msg.removed)
        out = self._apply(msg.ints, msg.loss, msg.contributors, msg.params_sha256, sender, msg.unchecked)
        if msg.tasks and msg.term == self.term and self.sha() == msg.params_sha256:
            # the next step's tasks, started the moment the total is applied (not on a
            # replica that just diverged: it waits for its STATE; a backup takes the task)
            out += self.on_assign(sender, F.Assign(msg.term, msg.step + 1, msg.tasks))
        return out

    def on_state(self, sender: str, msg: F.State) -> list[Output]:
        if self.trainer is None or sender != self.coord:
            return []
        restore, self.restoring = self.restoring, None
        if params_sha256(msg.theta[:self.trainer.layout.size]) != msg.params_sha256:
            return [Log(f"state from {sender} does not match its hash: ignored", loud=True)]
        if restore is None and (msg.step, msg.params_sha256) == (self.step, self.sha()):
            # this replica's own state (a ready of ours overtaken by the step it named: the
            # coordinator answered it with the state we reached since): the work of this step
            # under way (a ring, a task) goes on (seed 11794: the ring was dropped, its commit lost)
            return [Log(f"state from {sender} is this replica's own (step {msg.step}, "
                        f"params {msg.params_sha256[:12]}): kept")]
        if restore is not None and restore != (msg.step, msg.params_sha256):
            return [Log(f"restore from {sender}: the state (step {msg.step}, params "
                        f"{msg.params_sha256[:12]}) is not the announced checkpoint (step "
                        f"{restore[0]}, params {restore[1][:12]}): ignored", loud=True)]
        try:
            state = checked_state(self.trainer, msg.step, msg.theta, msg.m, msg.v, msg.b1t, msg.b2t)
        except RestoreError as exc:
            return [Log(f"state from {sender}: {exc}: ignored", loud=True)]
        self.load(state)
        out: list[Output] = [Log(f"synced to step {msg.step} from {sender} "
                                 f"(params {msg.params_sha256[:12]})")]
        if restore is not None:
            out.append(Restored(msg.step, msg.params_sha256, sender))
        return out + self.aggregation.synced()  # (a held ring plan of this step starts)

    def on_restore(self, sender: str, msg: F.Restore) -> list[Output]:
        """The coordinator restored the room: the STATE that follows replaces ours."""
        if self.refused or self.trainer is None or msg.term < self.term:
            return []
        if sender not in (self.coord, self.peer.host):
            return [Log(f"a restore from {sender}, who does not coordinate the run: ignored", loud=True)]
        self.coord, self.term = sender, msg.term
        self.restoring = (msg.step, msg.params_sha256)
        self.pending.clear()
        self.ended = False
        return [Log(f"{sender} restores the room from a checkpoint: step {msg.step}, "
                    f"params {msg.params_sha256[:12]}")]

    def on_end(self, sender: str, msg: F.End) -> list[Output]:
        if sender != self.coord or self.trainer is None or self.ended:
            return []
        if self.aggregation.holds_end(msg):  # (our ring's last total is still gathering)
            return []
        self.ended = True
        return [Ended(msg.step, self.sha(), self.sha() == msg.params_sha256 and msg.step == self.step)]

    def on_data(self, sender: str, msg: F.Data) -> list[Output]:
        if sender != self.coord:
            return []
        return self.data(msg.data) if self.awaiting_data else []

    def on_syncrequest(self, sender: str, msg: F.SyncRequest) -> list[Output]:
        """The coordinator that follows us asks for this replica's state (a new coordinator
        that is behind): answered once per term and step. Anyone else is not answered: a
        STATE is ~8 bytes a parameter, so an unanswered request costs nobody anything."""
        if self.trainer is None or sender != self.coord or msg.term != self.term:
            return []
        if self.answered == (self.term, self.step):
            return []
        self.answered = (self.term, self.step)
        return [Send(sender, self.state())]

    def on_datarequest(self, sender: str, msg: F.DataRequest) -> list[Output]:
        """The run's dataset, once per peer that asks (a joiner whose fetch from the server
        failed asks once; more would be a way to make this peer send megabytes on demand)."""
        if self.trainer is None or msg.fingerprint != self.trainer.ds.fingerprint \
                or sender in self.data_sent:
            return []
        self.data_sent.add(sender)
        return [Send(sender, F.Data(self.trainer.ds.fingerprint, self.trainer.ds.to_bytes()))]

    def _apply(self, ints, loss, contributors, sha, sender, unchecked=()) -> list[Output]:
        step = self.step
        why = self.trainer.contribution_error(ints, range(self.trainer.n_tasks), step)  # local steps
        if why:
            return [Log(f"a total of step {step} from {self.peer._name(sender)} that no replica makes "
                        f"({why}): ignored", loud=True)]
        window = self.window_for()
        self.trainer.apply(ints)
        window.record(self.trainer, step, ints, unchecked)
        self.pending = {k: v for k, v in self.pending.items() if k[0] > step}
        out = self.committed(step, loss, contributors, sha)
        mine = self.sha()
        if mine != sha:
            out.append(Log(f"PARAMETER HASH MISMATCH after step {step}: {mine[:16]} here, "
                           f"{sha[:16]} at the coordinator: resyncing", loud=True))
            out.append(Send(sender, F.SyncRequest(self.term, self.step, mine, "hash mismatch")))
        return out

    def on_refuse(self, sender: str, msg: F.Refuse) -> list[Output]:
        """The coordinator removed this replica from the run (``reasons``: why); a new host the
        server names may say it again (the one that removed it died first), and the host named
        before may say it in the term before (its refuse overtaken by a step-down: seed 7306)."""
        before = sender == self.peer.prev_host and msg.term < self.term
        if (sender not in (self.coord, self.peer.host) and not before) or self.refused:
            return []
        self.refused = self.ended = True
        self.pending.clear()
        reason = "; ".join(msg.reasons)
        return [Log(f"removed from the run by {self.peer._name(sender)}: {reason}", loud=True),
                Removed(sender, reason)]

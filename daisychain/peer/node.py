"""One headless peer at work: the signaling client, the aiortc mesh and the sans-IO
:class:`~daisychain.peer.run.RunPeer`, wired together on one event loop.

``Node(options).run()`` joins (or creates) a room, trains until the run ends and returns a
summary dict. Computes run in a worker thread, so the loop keeps the data channels moving.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import aiohttp

from daisychain.meta import ENGINE_VERSION
from daisychain.engine.local import make_trainer
from daisychain.engine.spec import Hyper, ModelSpec
from daisychain.engine.trainer import Trainer, TrainState
from daisychain.peer import frames as F
from daisychain.peer import run as R
from daisychain.peer.faults import FAULTS, Liar
from daisychain.peer.client import SignalingClient, SignalingError, http_url
from daisychain.peer.rtc import Mesh
from daisychain.peer.selftest import selftest
from daisychain import signaling as p
from daisychain.units import load_luts

log = logging.getLogger("daisychain.peer")
TICK_S = 0.1
#: seconds between tries to reach the signaling server again after it went away mid-run
RECONNECT_S = (0.5, 1.0, 2.0, 4.0)


def _one_blas_thread() -> None:
    """BLAS on one thread for this process (set as the compute thread starts). The engine's
    GEMMs are small; with OpenBLAS's own worker threads, every GEMM of the compute thread
    waited for them (they spin), which on a busy 2-core machine made a ~1 ms step's compute
    take ~59 ms (bench/mesh.py)."""
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(1, user_api="blas")
    except Exception:  # noqa: BLE001 - only speed depends on it
        log.debug("could not limit BLAS threads", exc_info=True)


#: one compute thread per process: numpy's BLAS is fastest when not called from many threads
_COMPUTE = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="daisy-compute",
                                                 initializer=_one_blas_thread)


@dataclass
class NodeOptions:
    server: str
    room: str = p.ROOM_NETWORK          #: "network", "new" (create) or a private code
    name: str = "daisy-peer"
    capacity: float | None = None       #: micro-batches/s; None: measure
    approve: str = "all"                #: host policy: all | prompt | none
    wait_peers: int = 0
    settings: object | None = None      #: RunSettings (the host of a new room)
    luts: str | None = None             #: table directory (default: the package's)
    engine_version: str = ENGINE_VERSION
    on_event: Callable[[object, "Node"], None] | None = None
    on_room: Callable[[str, "Node"], None] | None = None  #: called with the private room code
    save_checkpoint: str | None = None  #: write the replica's .pt here at the end and when stopped
    save_every: int = 0                 #: ... and every N steps (0: never)
    resume: str | None = None           #: the host of a new room: start from this checked .pt
    verify_rate: float = R.VERIFY_RATE  #: host: share of micro-batches spot-checked each step
    strikes: int = R.STRIKES            #: host: mismatches after which a peer is removed
    aggregate: str = "auto"             #: auto | star | ring (peer/run/ring.py; when coordinating)
    fault: str | None = None            #: TESTING ONLY: corrupt what this peer sends (FAULTS)
    #: a joiner's own task (--task module:Name): the dataset fingerprint it expects; a run on
    #: other data is refused in words
    expect_dataset: str | None = None
    threads: int = 1                    #: a step's micro-batches on this many threads (--threads)


@dataclass
class Stats:
    compute_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    first_contribution_s: float | None = None
    step_times: list = field(default_factory=list)
    computed: int = 0  #: micro-batches this peer computed (spot-check second answers included)


class PeerFailed(Exception):
    """The peer cannot take part; ``str(err)`` says why (refused run, server error...)."""


class Node:
    def __init__(self, opts: NodeOptions):
        self.o = opts
        self.luts = load_luts(opts.luts)
        self.selftest = selftest(self.luts)
        self.run: R.RunPeer | None = None
        self.mesh: Mesh | None = None
        self.client: SignalingClient | None = None
        self.session: aiohttp.ClientSession | None = None
        self.me = ""
        self.code: str | None = None
        self.members: dict[str, p.Member] = {}
        self.kinds: dict[str, tuple[str, str]] = {}  # peer -> (name, kind), for the summary
        self.reasm: dict[str, F.Reassembler] = {}
        self.done = asyncio.Event()
        self.result: dict | None = None
        self.failure: str | None = None
        self.stats = Stats()
        self.msg_no = 0
        self.tasks: set[asyncio.Task] = set()
        self.last_step_at = time.perf_counter()
        self.loss = float("nan")
        self.shares: tuple = ()
        self.decided: set[str] = set()
        self.restores: list[dict] = []  # checkpoint restores this replica took part in
        self.alarms: list[dict] = []    # spot-check alarms this peer raised (coordinator)
        self._ready_trainer: Trainer | None = None
        self.liar = Liar(opts.fault) if opts.fault else None  # --fault: a liar, for tests
        self._capacity = opts.capacity

    # -- building the replica ------------------------------------------------------------

    def _make_trainer(self, identity: dict, ds) -> Trainer:
        want = self.o.expect_dataset
        if want and ds.fingerprint != want:
            raise ValueError(f"this peer's task gives other data (dataset fingerprint {want[:16]} "
                             f"here, {ds.fingerprint[:16]} in the run: task {ds.task!r})")
        tr = make_trainer(ModelSpec.from_json(identity["model"]), Hyper(**identity["hyper"]), ds, self.luts,
                          threads=self.o.threads)
        if self.o.engine_version != ENGINE_VERSION:
            tr.identity = {**tr.identity, "engine": self.o.engine_version}
        return tr

    def _host_trainer(self) -> Trainer:
        """The host's replica: fresh, or the checked state of ``--resume`` (another run's file
        is refused with the list of differences)."""
        from daisychain.engine.checkpoint import CheckpointError, read_checkpoint_file

        s = self.o.settings
        tr = make_trainer(s.spec, s.hp, s.ds, self.luts, threads=self.o.threads)
        if self.o.engine_version != ENGINE_VERSION:
            tr.identity = {**tr.identity, "engine": self.o.engine_version}
        if self.o.resume:
            try:
                ck = read_checkpoint_file(self.o.resume, tr.identity)
            except CheckpointError as exc:
                raise PeerFailed(f"cannot resume: {exc}") from None
            if ck.step > s.steps:
                raise PeerFailed(f"cannot resume: {self.o.resume} is at step {ck.step}, past "
                                 f"--steps {s.steps} (the run's total)")
            tr.load(ck.local if s.hp.local else TrainState(ck.theta, ck.adam, ck.step))  # the seam's loader
            log.warning("resuming run %s from %s at step %d (params %s)", tr.run_id,
                        self.o.resume, ck.step, ck.params_sha256[:12])
        return tr

    def save_checkpoint(self, why: str = "") -> str | None:
        """Write this replica's state to ``--save-checkpoint`` (atomically); the path, or None
        when there is nothing to save or nowhere to save it."""
        from daisychain.engine.checkpoint import write_checkpoint_file

        tr = self.run.trainer if self.run else None
        if not self.o.save_checkpoint or tr is None:
            return None
        st = tr.state
        try:
            local = st if tr.hp.local else None  # a local-steps run: its whole round state
            write_checkpoint_file(self.o.save_checkpoint, tr.identity, st.step, st.theta,
                                  getattr(st, "adam", None), tr.ds.meta.get("vocab"), local)
        except OSError as exc:
            log.warning("could not save the checkpoint to %s: %s", self.o.save_checkpoint, exc)
            return None
        log.log(logging.INFO if why == "autosave" else logging.WARNING,
                "checkpoint saved%s: %s (step %d, params %s)", f" ({why})" if why else "",
                self.o.save_checkpoint, st.step, tr.params_sha256()[:12])
        return self.o.save_checkpoint

    def _new_run_peer(self) -> R.RunPeer:
        s = self.o.settings
        if s is not None:
            tr = self._ready_trainer
            return R.RunPeer(self.me, trainer=tr, steps=s.steps, capacity=self._capacity,
                             wait_peers=self.o.wait_peers, selftest=self.selftest,
                             verify_rate=self.o.verify_rate, strikes=self.o.strikes,
                             aggregate=self.o.aggregate)
        return R.RunPeer(self.me, make_trainer=self._make_trainer, capacity=self.o.capacity,
                         selftest=self.selftest, verify_rate=self.o.verify_rate,
                         strikes=self.o.strikes,
                         aggregate=self.o.aggregate)

    # -- the loop ------------------------------------------------------------------------

    async def main(self) -> dict:
        """Run to the end of the run; raises PeerFailed with a message."""
        if self.o.settings is not None and not self.selftest[0]:
            raise PeerFailed(f"self-test failed: {self.selftest[1]}")
        self._capacity = self.o.capacity
        if self.o.settings is not None:
            self._ready_trainer = self._host_trainer()
            if self._capacity is None:  # the room sees what the shares will follow
                self._capacity = R.measure_capacity(self._ready_trainer)
        if self.liar:
            log.warning("TESTING FAULT --fault %s: this peer %s (it is a liar on purpose)",
                        self.o.fault, FAULTS[self.o.fault])
        self.session = aiohttp.ClientSession()
        try:
            self.client = SignalingClient(self.o.server, self.session)
            welcome = await self.client.connect(self.o.name, "python", self._announced(), self.o.room)
            self.me = welcome.id
            self.run = self._new_run_peer()
            self.mesh = Mesh(self.me, self._signal, self._on_open, self._on_message,
                             self._on_close, welcome.ice_servers)
            reader = asyncio.ensure_future(self._read_signaling())
            ticker = asyncio.ensure_future(self._tick())
            if self.o.settings is not None:
                self._feed(self.run.start(time.monotonic()))
            try:
                waiter = asyncio.ensure_future(self.done.wait())
                await asyncio.wait({reader, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if reader.done() and not self.done.is_set():
                    exc = reader.exception()
                    raise PeerFailed(str(exc) if exc else "the signaling connection ended")
            finally:
                for t in (reader, ticker):
                    t.cancel()
            if self.failure:
                raise PeerFailed(self.failure)
            await self.mesh.drain()
            return self.result
        except asyncio.CancelledError:  # Ctrl-C (asyncio.run cancels us): keep the state
            self.save_checkpoint("stopped")
            raise
        finally:
            await self.close()

    def _announced(self) -> float:
        """The capacity this device gives the server: the measured one once there is one
        (the host measures before it connects; a member measures on the run it joins)."""
        c = self.run.capacity if self.run is not None and self.run.capacity else self._capacity
        return float(c or 1.0)

    async def close(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        if self.mesh is not None:
            await self.mesh.drain(1.0)
            await self.mesh.close()
        if self.client is not None:
            await self.client.leave()
        if self.session is not None:
            await self.session.close()

    async def _tick(self) -> None:
        from daisychain.peer.links import LinkReporter
        links = LinkReporter()  # this peer's row of the page's connectivity matrix
        while True:
            await asyncio.sleep(TICK_S)
            if self.run is not None:
                self._guarded("tick", lambda: self.run.tick(time.monotonic()))
            await links.tick(self)

    async def _read_signaling(self) -> None:
        """Read the server's messages. If the connection ends during a run, the run goes on
        over the data channels (they do not need the server) while this tries to resume its
        identity with its token; outside a run the end is an error (raised)."""
        while True:
            try:
                while True:
                    msg = await self.client.recv()
                    handler = getattr(self, "_sig_" + msg.TYPE, None)
                    if handler is None:
                        continue
                    try:
                        await handler(msg)
                    except Exception as exc:  # noqa: BLE001 - a bug: the run ends with it
                        self._internal_error(f"a signaling {msg.TYPE} message from "
                                             f"{getattr(msg, 'sender', None) or 'the server'}", exc)
            except SignalingError as exc:
                if not self._in_run():
                    raise
                self._event(R.Log(f"lost the signaling server ({exc}): the run goes on over the "
                                  "data channels; reconnecting", loud=True))
            if not await self._reconnect():
                await asyncio.Event().wait()  # no signaling for the rest of the run

    def _in_run(self) -> bool:
        r = self.run
        return r is not None and r.run is not None and r.trainer is not None and not r.refused

    async def _reconnect(self) -> bool:
        """Reach the server again as the same device (its reconnect token). True: signaling
        resumed. False: the server no longer knows this device (it restarted, or the grace
        period passed); the run is finished over the data channels alone."""
        token = self.client.welcome.token if self.client.welcome else None
        for i in range(1 << 30):
            await asyncio.sleep(RECONNECT_S[min(i, len(RECONNECT_S) - 1)])
            client = SignalingClient(self.o.server, self.session)
            try:
                welcome = await client.connect(self.o.name, "python", self._announced(),
                                               self.code or p.ROOM_NETWORK, token=token)
            except SignalingError:
                await client.leave()
                continue
            if welcome.resumed and welcome.id == self.me:
                self.client = client
                self._event(R.Log(f"reconnected to the signaling server as {self.me}"))
                return True
            await client.leave()  # a new identity would be a stranger to our data channels
            self._event(R.Log("the signaling server no longer knows this device (it restarted, "
                              "or we were away longer than its grace period): the run is "
                              "finished over the data channels, without signaling (no new "
                              "members, no hand-over)", loud=True))
            return False
        return False

    async def _signal(self, kind: str, to: str, payload) -> None:
        if kind == "offer":
            await self.client.send(p.Offer(sdp=payload, to=to))
        elif kind == "answer":
            await self.client.send(p.Answer(sdp=payload, to=to))

    # -- signaling messages ----------------------------------------------------------------

    async def _sig_room(self, msg: p.RoomState) -> None:
        if msg.code and msg.code != self.code:
            self.code = msg.code
            if self.o.on_room:
                self.o.on_room(msg.code, self)
        self.members = {m.id: m for m in msg.members}
        for m in msg.members:
            self.kinds[m.id] = (m.name, m.kind)
        for d in msg.pending:
            await self._decide(d)
        ids = [m.id for m in msg.members]
        await self.mesh.update(ids)
        names = {m.id: m.name for m in msg.members}
        self._guarded("room", lambda: self.run.room_changed(ids, msg.host, names))

    async def _sig_join_request(self, msg: p.JoinRequest) -> None:
        await self._decide(msg.peer)

    async def _decide(self, dev: p.Device) -> None:
        if dev.id in self.decided:
            return
        self.decided.add(dev.id)
        policy = self.o.approve
        if policy == "prompt":
            answer = await asyncio.to_thread(
                input, f"approve {dev.name} ({dev.kind}, {dev.capacity:g} micro-batches/s)? [y/N] ")
            ok = answer.strip().lower() in ("y", "yes")
        else:
            ok = policy == "all"
        await self.client.send(p.Approve(peer=dev.id) if ok else p.Deny(peer=dev.id))

    async def _sig_pending(self, msg: p.Pending) -> None:
        self._event(R.Log(f"waiting for the host of room {msg.code} to approve us"))

    async def _sig_error(self, msg: p.Error) -> None:
        if msg.code in ("denied", "no_such_room", "room_full", "too_many_pending", "version"):
            self._fail(f"server: {msg.message}")
        else:
            self._event(R.Log(f"server: {msg.message}"))

    async def _sig_offer(self, msg: p.Offer) -> None:
        await self.mesh.on_offer(msg.sender, msg.sdp)

    async def _sig_answer(self, msg: p.Answer) -> None:
        await self.mesh.on_answer(msg.sender, msg.sdp)

    async def _sig_candidate(self, msg: p.Candidate) -> None:
        await self.mesh.on_candidate(msg.sender, msg.candidate)

    # -- mesh events -----------------------------------------------------------------------

    def _on_open(self, peer: str) -> None:
        self.reasm[peer] = F.Reassembler()
        log.info("data channel to %s open", peer)
        self._guarded("channel open", lambda: self.run.channel_open(peer))

    def _on_close(self, peer: str) -> None:
        self.reasm.pop(peer, None)
        log.info("data channel to %s closed", peer)
        self._guarded("channel close", lambda: self.run.channel_closed(peer))

    def _on_message(self, peer: str, data) -> None:
        if self.run is not None and self.run.muted(peer):  # a flood of bad messages: dropped
            return
        r = self.reasm.setdefault(peer, F.Reassembler())
        try:
            m = r.feed(data)
            if m is None:
                return
            tr = self.run.trainer
            msg = F.from_message(m, tr.total_size if tr else None, tr.state_sizes if tr else None)
        except F.FrameError as exc:
            self.reasm[peer] = F.Reassembler()
            self._guarded("bad message", lambda: self.run.bad_message(peer, str(exc)))
            return
        self._guarded(f"a message from {peer}", lambda: self.run.receive(peer, msg, m.run_id))

    def _guarded(self, what: str, step) -> None:
        """Run one input of the run state machine and perform its outputs; an exception is
        a bug, never a reason to stall: the run ends with it (its traceback in the log, the
        reason in PeerFailed). The run's clock is brought up to now first (it times tasks:
        RunPeer._time_task)."""
        if isinstance(self.run, R.RunPeer):
            self.run.now = max(self.run.now, time.monotonic())
        try:
            self._feed(step())
        except Exception as exc:  # noqa: BLE001 - a bug: the run ends with it, never hangs
            self._internal_error(what, exc)

    def _internal_error(self, what: str, exc: BaseException) -> None:
        log.error("internal error while handling %s: %r", what, exc,
                  exc_info=(type(exc), exc, exc.__traceback__))
        self._fail(f"internal error while handling {what}: {type(exc).__name__}: "
                   f"{str(exc).splitlines()[0][:300] if str(exc) else ''}")

    # -- run outputs -----------------------------------------------------------------------

    def _feed(self, outputs) -> None:
        for o in outputs:
            if isinstance(o, R.Send):
                message, allow_nan = self.liar.corrupt(o.message) if self.liar else (o.message, False)
                try:
                    msg = F.to_message(message, self.run.run_id, self.run.bounds)
                    self.msg_no += 1
                    frames = F.encode_frames(msg, self.msg_no, _allow_nan=allow_nan)
                except F.FrameError as exc:
                    log.warning("cannot send %s to %s: %s", R.message_name(message), o.to, exc)
                    continue
                self.mesh.send(o.to, frames)
            elif isinstance(o, R.Compute):
                self._spawn(self._compute(o))
            elif isinstance(o, R.FetchData):
                self._spawn(self._fetch(o))
            else:
                self._event(o)

    def _spawn(self, coro) -> None:
        t = asyncio.ensure_future(coro)
        self.tasks.add(t)
        t.add_done_callback(self._task_done)

    def _task_done(self, t: asyncio.Task) -> None:
        self.tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            self._internal_error("a background task", t.exception())

    async def _compute(self, c: R.Compute) -> None:
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        result, took = await loop.run_in_executor(_COMPUTE, R.contribute_timed, self.run.trainer,
                                                  c.theta, c.step, c.micro)
        if result is None:  # a local-steps round its trainer no longer holds: the room moved on
            return log.info("dropped a compute of round %d: the room moved past it", c.step)
        self.stats.compute_s += time.perf_counter() - t0
        self.stats.computed += len(c.micro)
        if self.stats.first_contribution_s is None:
            self.stats.first_contribution_s = time.perf_counter() - self.stats.started
        self._guarded("a finished compute", lambda: self.run.computed(c.step, c.task, result, c.term, took))

    async def _fetch(self, f: R.FetchData) -> None:
        blob = None
        try:
            url = f"{http_url(self.o.server)}/data/{f.task}.dcds"
            # a room's upload is served only to its members: the device's session token proves it
            token = self.client.welcome.token if self.client.welcome else None
            headers = {"X-Daisy-Token": token} if token else None
            async with self.session.get(url, params={"fingerprint": f.fingerprint},
                                        headers=headers) as resp:
                if resp.status == 200:
                    blob = await resp.read()
        except (aiohttp.ClientError, OSError):
            blob = None
        self._guarded("the dataset", lambda: self.run.data(blob))

    def _event(self, e) -> None:
        if isinstance(e, R.Committed):
            now = time.perf_counter()
            self.stats.step_times.append(now - self.last_step_at)
            self.last_step_at = now
            self.loss, self.shares = e.loss, e.contributors
            log.info("step %d committed: params %s, loss %.4f, from %s", e.step, e.params_sha256[:12],
                     e.loss, ", ".join(f"{k} {v}" for k, v in e.contributors))
            if self.o.save_every and (e.step + 1) % self.o.save_every == 0:
                self.save_checkpoint("autosave")
        elif isinstance(e, R.Refused) and e.peer == self.me:
            self._fail("refused the run: " + "; ".join(e.reasons))
        elif isinstance(e, R.Removed):
            self._fail(f"removed from the run by {e.by}: {e.reason}")
        elif isinstance(e, R.Ended):
            if self.mesh is not None:  # peers leave now: a channel that closes is no loss to relink
                self.mesh.closing = True
            self.result = self.summary(e)
            self.result["checkpoint"] = self.save_checkpoint()
            self.done.set()
        elif isinstance(e, R.Log):
            # run_event: a progress line that shows these (daisy-peer's) keeps them off the log
            log.log(logging.WARNING if e.loud else logging.INFO, "%s", e.text,
                    extra={"run_event": True})
        elif isinstance(e, R.Alarm):
            self.alarms.append({"kind": e.kind, "peer": e.peer, "name": e.name, "step": e.step,
                                "micro": e.micro, "strikes": e.strikes})
        elif isinstance(e, R.Restored):
            self.restores.append({"step": e.step, "params_sha256": e.params_sha256, "by": e.by})
            log.warning("restored from a checkpoint by %s: step %d, params %s",
                        "us" if e.by == self.me else e.by, e.step, e.params_sha256[:12])
        if self.o.on_event:
            self.o.on_event(e, self)

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
        self.done.set()

    def summary(self, end: R.Ended) -> dict:
        tr = self.run.trainer
        peers = []
        for pid, n in sorted(self.run.done_by.items()):
            name, kind = self.kinds.get(pid, ("?", "?"))
            if pid == self.me:
                name, kind = self.o.name, "python"
            peers.append({"id": pid, "name": name, "kind": kind, "micro_batches": n})
        out, inn = self.mesh.bytes()
        return {"run_id": tr.run_id, "identity": tr.identity, "steps": end.step,
                "params_sha256": end.params_sha256, "agreed": end.agreed,
                "accuracy": tr.accuracy("test"), "test_mse": tr.mse("test"), "loss": self.loss,
                "peers": peers,
                "me": self.me, "room": self.code, "bytes_sent": out, "bytes_received": inn,
                "compute_s": self.stats.compute_s, "restores": list(self.restores),
                "alarms": list(self.alarms), "units": self._unit_counts(end, tr),
                "steps_per_s": self._steps_per_s(),
                "slowest_step_s": max(self.stats.step_times[1:], default=None),
                "computed_micro_batches": self.stats.computed,
                "seconds": time.perf_counter() - self.stats.started,
                "replayed": getattr(tr, "replayed", 0),  # local steps: replica rounds from an anchor
                "coordinated": bool(getattr(self.run, "coordinating", False)),
                "capacity": self.run.capacity}

    def _steps_per_s(self) -> float | None:
        """Committed steps per second from the first commit this peer saw to its last (the
        time before the first, joining and waiting, is not in it); None under two steps."""
        t = self.stats.step_times[1:]
        return len(t) / sum(t) if t and sum(t) > 0 else None

    def _unit_counts(self, end: R.Ended, tr: Trainer) -> dict:
        """Unit invocations: the whole run's (steps x micro-batches per step, each counted
        once) and this peer's own share of it."""
        from daisychain.engine.counters import unit_counts
        mine = self.run.done_by.get(self.me, 0)
        per = tr.hp.n_micro * tr.hp.sync_every if tr.hp.local else 1  # micro-batches of a task
        mine *= per
        total = end.step * tr.n_tasks * per
        return {"run_micro_batches": total, "mine_micro_batches": mine,
                "run": unit_counts(tr.spec, tr.hp.micro_batch, total),
                "mine": unit_counts(tr.spec, tr.hp.micro_batch, mine)}


def _why_none(out: dict, u: dict) -> str:
    """Why this peer computed no micro-batch, in words (empty when it computed some)."""
    if u["mine_micro_batches"]:
        return ""
    cap = out.get("capacity")
    mine = f"its capacity {cap:.3g} micro-batches/s" if cap else "its capacity"
    if out.get("coordinated"):
        return (f": as the coordinator it split every step by capacity and the link times, and "
                f"{mine} left it no share beside the others; it dispatched, summed and checked")
    return f": the coordinator's split gave it no share ({mine} against the room's)"


def print_summary(out: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(out))
        return
    who = ", ".join(f"{p['name']} ({p['kind']}) {p['micro_batches']}" for p in out["peers"])
    local = "replicas" in out.get("identity", {}).get("hyper", {})  # a step is a round, a task a replica
    score = (f"test mse: {out['test_mse']:.6g}" if out.get("test_mse") is not None
             else f"test accuracy: {out['accuracy'] * 100:.2f}%")
    print(f"{score} (the test split)  "
          f"last training batch's loss: {out['loss']:.4f}  "
          f"({out['steps']} {'rounds; replica rounds' if local else 'steps; micro-batches'}: {who})")
    from daisychain.engine.counters import format_counts
    u = out.get("units")
    if u:
        print(f"whole run ({u['run_micro_batches']} micro-batches): {format_counts(u['run'])}")
        print(f"this peer ({u['mine_micro_batches']} micro-batches{_why_none(out, u)}): {format_counts(u['mine'])}")
    if local:
        print(f"replica rounds replayed from an anchor here: {out.get('replayed', 0)}")
    for a in out.get("alarms", ()):
        if a["kind"] == "removed":
            print(f"liar removed: {a['name']} ({a['peer']}) at step {a['step']}")
    if not out["agreed"]:
        print("WARNING: this replica's hash differs from the coordinator's", file=sys.stderr)
    print(f"params-sha256: {out['params_sha256']}")

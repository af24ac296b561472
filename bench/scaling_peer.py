"""One peer process of bench/scaling.py: the real ``daisy-peer`` (same arguments, same output)
with timing hooks, an optional user-space delay on every outgoing data datagram, and two
extra modes for the same network: a raw data-channel probe and a Gloo all-reduce.

Environment:

* ``SCALING_OUT``: write this process's timings (JSON) there at exit: per hook a list of
  (when it ended, seconds), so that start-up can be left out;
* ``SCALING_PROFILE``: run daisy-peer under cProfile (main thread), stats written there;
* ``SCALING_SCTP_BURST``: an experiment, not daisy-peer's behaviour: aiortc's SCTP puts up
  to this many chunks beyond those in flight on the wire per transmit, instead of 4
  (RFC 4960's Max.Burst; ``_transmit`` is recompiled with the number replaced);
* ``SCALING_DELAY_MS``: hold every datagram aioice sends on an ICE connection (DTLS/SCTP,
  i.e. all data-channel traffic) this long before it goes out (a delay-line thread, see
  ``_add_delay``): both peers do it, so each direction gets the delay once (STUN checks
  are not delayed).

Modes (first argument):

* ``peer ARGS...``: daisy-peer ARGS (one BLAS thread, like bench/train.py);
* ``raw offer|answer DIR NBYTES``: two processes open one aiortc data channel (the offer and
  the answer pass through files in DIR), then the offerer measures the round trip of a
  small message (median of 200 ping-pongs) and the rate of an NBYTES transfer;
* ``gloo RANK ADDR N``: a torch.distributed Gloo all-reduce of N int64 and N float32 values
  between two processes (rank 0 listens on ADDR), mean of 50.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import asyncio  # noqa: E402
import atexit  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

T: dict = {"compute_cpu": [], "compute_wall": [], "encode": [], "decode": [], "apply": [],
           "commits": [], "messages_out": [], "messages_in": []}


def _add_delay(ms: float) -> None:
    """Every datagram aioice sends on an ICE connection goes out ``ms`` later, from a delay
    line: a thread that sleeps until the oldest datagram is due and hands it to the event
    loop (``call_soon_threadsafe``). ``loop.call_later`` would round every delay up to the
    next millisecond (epoll's timeout), i.e. 1-2 ms for 1 ms."""
    import collections
    import threading

    import aioice.ice

    delay = ms / 1000.0
    line: collections.deque = collections.deque()
    due = threading.Condition()

    def run() -> None:
        while True:
            with due:
                while not line:
                    due.wait()
                when = line[0][0]
            wait = when - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            now = time.monotonic()
            with due:
                batch = []
                while line and line[0][0] <= now:
                    batch.append(line.popleft())
            by_loop: dict = {}
            for _, loop, fn, data, addr in batch:
                by_loop.setdefault(loop, []).append((fn, data, addr))
            for loop, items in by_loop.items():
                loop.call_soon_threadsafe(_send_all, items)

    def _send_all(items) -> None:
        for fn, data, addr in items:
            fn(data, addr)

    threading.Thread(target=run, name="delay-line", daemon=True).start()

    async def send_data(self, data, addr):
        with due:
            line.append((time.monotonic() + delay, asyncio.get_running_loop(),
                         self.transport.sendto, data, addr))
            due.notify()

    aioice.ice.StunProtocol.send_data = send_data


def _sctp_burst(n: int) -> None:
    """aiortc's ``RTCSctpTransport._transmit`` with a burst of ``n`` chunks instead of 4."""
    import inspect
    import textwrap

    import aiortc.rtcsctptransport as S

    src = textwrap.dedent(inspect.getsource(S.RTCSctpTransport._transmit))
    old = "burst_size = 4 * USERDATA_MAX_LENGTH"
    if old not in src:
        raise SystemExit("SCALING_SCTP_BURST: this aiortc's _transmit has no Max.Burst line")
    scope: dict = {}
    exec(compile(src.replace(old, f"burst_size = {n} * USERDATA_MAX_LENGTH"), S.__file__, "exec"),
         S.__dict__, scope)
    S.RTCSctpTransport._transmit = scope["_transmit"]


def _instrument() -> None:
    from daisychain.engine.trainer import Trainer
    from daisychain.peer import frames as F
    from daisychain.peer import node as N
    from daisychain.peer import run as R

    def wrap(mod, name, key, cpu=False):
        inner = getattr(mod, name)

        def timed(*a, **k):
            c, w = time.thread_time(), time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                end = time.perf_counter()  # (when it ended, how long it took)
                T[key].append((end, end - w))
                if cpu:
                    T["compute_cpu"].append((end, time.thread_time() - c))
        setattr(mod, name, timed)

    wrap(R, "contribute_at", "compute_wall", cpu=True)
    wrap(F, "to_message", "encode")  # the integer codecs (encode_ints) run here
    wrap(F, "encode_frames", "encode")
    wrap(F, "from_message", "decode")
    wrap(Trainer, "apply", "apply")
    from daisychain.peer import rtc
    link_send = rtc.Link.send

    def counted(self, frames):
        T["messages_out"].append((time.perf_counter(), 1))
        T.setdefault("bytes_out", []).append((time.perf_counter(), sum(len(f) for f in frames)))
        return link_send(self, frames)
    rtc.Link.send = counted
    decode = F.from_message

    def counted_in(*a, **k):
        T["messages_in"].append((time.perf_counter(), 1))
        return decode(*a, **k)
    F.from_message = counted_in
    event = N.Node._event

    def on_event(self, e):
        if isinstance(e, R.Committed):
            T["commits"].append(time.perf_counter())
            T.setdefault("commit_cpu", []).append(time.process_time())  # all threads
        return event(self, e)
    N.Node._event = on_event


def _dump() -> None:
    out = os.environ.get("SCALING_OUT")
    if out:
        T["process_cpu_s"] = time.process_time()  # all threads, the whole process lifetime
        Path(out).write_text(json.dumps(T))


# ---------------------------------------------------------------- raw channel probe
async def _raw(role: str, folder: Path, nbytes: int) -> dict | None:
    from aiortc import RTCPeerConnection, RTCSessionDescription

    from daisychain.peer.rtc import rtc_configuration

    pc = RTCPeerConnection(rtc_configuration(()))
    got: asyncio.Queue = asyncio.Queue()
    opened = asyncio.Event()
    chan = {}

    def wire(ch):
        chan["ch"] = ch
        ch.on("message", lambda m: got.put_nowait(m))
        if ch.readyState == "open":
            opened.set()
        ch.on("open", opened.set)

    async def read_file(name):
        p = folder / name
        while not p.exists():
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)
        return json.loads(p.read_text())

    if role == "offer":
        wire(pc.createDataChannel("raw"))
        await pc.setLocalDescription(await pc.createOffer())
        (folder / "offer.json").write_text(json.dumps({"sdp": pc.localDescription.sdp}))
        ans = await read_file("answer.json")
        await pc.setRemoteDescription(RTCSessionDescription(ans["sdp"], "answer"))
    else:
        pc.on("datachannel", wire)
        off = await read_file("offer.json")
        await pc.setRemoteDescription(RTCSessionDescription(off["sdp"], "offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        (folder / "answer.json").write_text(json.dumps({"sdp": pc.localDescription.sdp}))
    await asyncio.wait_for(opened.wait(), 60)
    ch = chan["ch"]
    result = None
    if role == "offer":
        rtts = []
        for _ in range(200):
            t = time.perf_counter()
            ch.send(b"p" * 32)
            await got.get()
            rtts.append(time.perf_counter() - t)
        chunk = 64 * 1024 - 36
        rates = []
        for _ in range(10):
            t = time.perf_counter()
            left = nbytes
            while left > 0:
                ch.send(b"b" * min(chunk, left))
                left -= chunk
            await got.get()  # the answerer acknowledges the whole transfer
            rates.append(nbytes / (time.perf_counter() - t))
        ch.send(b"q")
        rtts.sort()
        rates.sort()
        result = {"rtt_s": rtts[len(rtts) // 2], "rate_Bps": rates[len(rates) // 2]}
        await asyncio.sleep(0.2)
    else:
        recv = 0
        while True:
            m = await got.get()
            if m == b"q":
                break
            if m.startswith(b"p"):
                ch.send(m)
                continue
            recv += len(m)
            if recv >= nbytes:
                recv = 0
                ch.send(b"a")
    await pc.close()
    return result


def _gloo(rank: int, addr: str, n: int) -> dict | None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT="29517")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    out = {}
    for name, dtype in (("int64", torch.int64), ("float32", torch.float32)):
        t = torch.ones(n, dtype=dtype)
        for _ in range(5):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(50):
            dist.all_reduce(t)
        out[name] = (time.perf_counter() - t0) / 50
    dist.destroy_process_group()
    return out if rank == 0 else None


def main(argv: list[str]) -> int:
    if os.environ.get("SCALING_SWITCH_S"):
        sys.setswitchinterval(float(os.environ["SCALING_SWITCH_S"]))
    if os.environ.get("SCALING_SCTP_BURST"):
        _sctp_burst(int(os.environ["SCALING_SCTP_BURST"]))
    if os.environ.get("SCALING_DELAY_MS"):
        _add_delay(float(os.environ["SCALING_DELAY_MS"]))
    mode, rest = argv[0], argv[1:]
    if mode == "peer":
        from daisychain.peer import cli
        _instrument()
        atexit.register(_dump)
        prof_path = os.environ.get("SCALING_PROFILE")
        if not prof_path:
            return cli.main(rest)
        import cProfile
        prof = cProfile.Profile()
        try:
            return prof.runcall(cli.main, rest)
        finally:
            prof.dump_stats(prof_path)
    if mode == "raw":
        res = asyncio.run(_raw(rest[0], Path(rest[1]), int(rest[2])))
    elif mode == "gloo":
        res = _gloo(int(rest[0]), rest[1], int(rest[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    if res is not None:
        print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

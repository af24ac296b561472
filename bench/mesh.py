"""Mesh benchmark: N in-process daisy-peers (real aiortc on loopback, the real server) train
the default digits run. Reports steps/s for 1..4 peers, the step time split, bytes on the
wire per step against a float32 all-reduce of the same gradient, the all-reduce payload rate
against a raw data-channel transfer of the same bytes in the same run, a torch.distributed
Gloo all-reduce of the same payload on loopback, and join-to-first-contribution time.

    .venv/bin/python -m bench.mesh [--steps 60]

One BLAS thread (OPENBLAS/OMP/MKL_NUM_THREADS=1, set before numpy loads), as in
bench/train.py: a peer computes in a worker thread, and with OpenBLAS's own threads on this
2-core machine every small GEMM of that thread waited for (spinning) BLAS workers: the
1-peer row showed 59 ms of "compute" per step, ~6 ms of CPU per call for ~1 ms of work.
"Compute" is now the CPU time of the compute thread inside ``contribute_at`` (the work
itself), and the wall time the step's computes took is shown beside it.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from bench._report import write_section  # noqa: E402
from daisychain.engine.settings import add_run_arguments, settings_from_args  # noqa: E402

_CPU: list = []  # (thread CPU s, wall s) of every contribute_at call of the current run


def _instrument() -> None:
    """Time every ``contribute_at`` call in a peer's compute thread (the step's work; not
    the capacity measurement before the run)."""
    from daisychain.peer import run as R
    if getattr(R.contribute_at, "_bench", False):
        return
    inner = R.contribute_at

    def timed(*a):
        if not threading.current_thread().name.startswith("daisy-compute"):
            return inner(*a)  # e.g. the capacity measurement before the run
        c, w = time.thread_time(), time.perf_counter()
        try:
            return inner(*a)
        finally:
            _CPU.append((time.thread_time() - c, time.perf_counter() - w))

    timed._bench = True
    R.contribute_at = timed


def train_loop_s(settings, steps: int = 200) -> float:
    """Seconds per step of the plain single-process loop (what ``daisychain train`` does:
    contribute all micro-batches, apply), in this process, for the 1-peer comparison."""
    from daisychain.engine.trainer import Trainer
    from daisychain.units import load_luts
    tr = Trainer(settings.spec, settings.hp, settings.ds, load_luts())
    ids = list(range(settings.hp.n_micro))
    tr.apply(tr.contribute(ids).grad)
    t = time.perf_counter()
    for _ in range(steps):
        tr.apply(tr.contribute(ids).grad)
    return (time.perf_counter() - t) / steps


async def mesh_run(settings, n: int):
    from daisychain.peer.demo import _serve
    from daisychain.peer.node import Node, NodeOptions
    from daisychain.peer import run as R

    _instrument()
    _CPU.clear()
    runner, port = await _serve(settings, 0)
    base = f"http://127.0.0.1:{port}"
    marks = {"first": None, "last": None}
    code = asyncio.get_running_loop().create_future()

    def on_event(e, node):
        if isinstance(e, R.Committed):
            now = time.perf_counter()
            marks["first"] = marks["first"] or now
            marks["last"] = now

    host = Node(NodeOptions(server=base, room="new", name="h", approve="all", wait_peers=n - 1,
                            settings=settings, on_event=on_event,
                            on_room=lambda c, _: code.done() or code.set_result(c)))
    tasks = [asyncio.ensure_future(host.main())]
    members = []
    await code
    for i in range(n - 1):
        m = Node(NodeOptions(server=base, room=code.result(), name=f"m{i}"))
        members.append(m)
        tasks.append(asyncio.ensure_future(m.main()))
    results = await asyncio.gather(*tasks)
    await runner.cleanup()
    steps = settings.steps - 1  # first commit is the time origin
    wall = (marks["last"] - marks["first"]) / max(steps, 1)
    compute_wall = max(r["compute_s"] for r in results) / settings.steps
    compute = sum(c for c, _ in _CPU) / settings.steps  # all peers' compute CPU per step
    sent = sum(r["bytes_sent"] for r in results) / settings.steps
    joins = [m.stats.first_contribution_s for m in members if m.stats.first_contribution_s]
    return {"n": n, "step_s": wall, "compute_s": compute, "compute_wall_s": compute_wall,
            "bytes_per_step": sent,
            "join_s": float(np.mean(joins)) if joins else None,
            "hash": results[0]["params_sha256"]}


async def raw_rate(nbytes: int, repeats: int = 20) -> float:
    """Bytes/s of a raw transfer of ``nbytes`` over one aiortc data channel on loopback."""
    from aiortc import RTCPeerConnection
    from daisychain.peer.rtc import rtc_configuration, use_loopback_only

    use_loopback_only()
    a, b = RTCPeerConnection(rtc_configuration(())), RTCPeerConnection(rtc_configuration(()))
    ch = a.createDataChannel("raw")
    got = asyncio.Queue()
    opened = asyncio.Event()
    ch.on("open", opened.set)

    @b.on("datachannel")
    def _(c):
        c.on("message", lambda m: got.put_nowait(len(m)))

    await a.setLocalDescription(await a.createOffer())
    await b.setRemoteDescription(a.localDescription)
    await b.setLocalDescription(await b.createAnswer())
    await a.setRemoteDescription(b.localDescription)
    await opened.wait()
    chunk = 64 * 1024 - 36
    t0 = time.perf_counter()
    for _ in range(repeats):
        left = nbytes
        while left > 0:
            ch.send(bytes(min(chunk, left)))
            left -= chunk
        recv = 0
        while recv < nbytes:
            recv += await got.get()
    dt = time.perf_counter() - t0
    await a.close()
    await b.close()
    return nbytes * repeats / dt


def _gloo_worker(rank, size, n, reps, port, q):
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    t = torch.ones(n, dtype=torch.float32)
    dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(t)
    if rank == 0:
        q.put((time.perf_counter() - t0) / reps)
    dist.destroy_process_group()


def gloo_allreduce_s(n: int, size: int = 2, reps: int = 50) -> float | None:
    try:
        import torch.multiprocessing as mp
    except ImportError:
        return None
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_gloo_worker, args=(r, size, n, reps, port, q)) for r in range(size)]
    for p in procs:
        p.start()
    out = q.get(timeout=120)
    for p in procs:
        p.join(30)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    add_run_arguments(ap, steps=60)
    ap.add_argument("--max-peers", type=int, default=4)
    args = ap.parse_args()
    settings = settings_from_args(args)
    from daisychain.engine.trainer import Trainer
    from daisychain.units import load_luts
    params = Trainer(settings.spec, settings.hp, settings.ds, load_luts()).layout.size
    f32 = 4 * params
    rows = [asyncio.run(mesh_run(settings, n)) for n in range(1, args.max_peers + 1)]
    hashes = {r["hash"] for r in rows}
    two = next(r for r in rows if r["n"] == 2)
    comm = max(two["step_s"] - two["compute_wall_s"], 1e-9)
    payload = two["bytes_per_step"]
    raw = asyncio.run(raw_rate(int(payload)))
    gloo = gloo_allreduce_s(params)
    loop_s = train_loop_s(settings)
    lines = ["| peers | steps/s | step ms | compute ms (CPU, all peers) | compute ms (wall, slowest peer) "
             "| all-reduce + waiting ms | wire bytes/step "
             "| float32 ring all-reduce bytes | ratio |", "|---|---|---|---|---|---|---|---|---|",
             f"| train loop (no mesh) | {1 / loop_s:.1f} | {loop_s * 1e3:.2f} | {loop_s * 1e3:.2f} | "
             f"{loop_s * 1e3:.2f} | 0 | 0 | 0 | n/a |"]
    for r in rows:
        ring = 2 * (r["n"] - 1) * f32
        ratio = f"{r['bytes_per_step'] / ring * 100:.0f}%" if ring else "n/a (1 peer)"
        lines.append(f"| {r['n']} | {1 / r['step_s']:.1f} | {r['step_s'] * 1e3:.1f} | "
                     f"{r['compute_s'] * 1e3:.2f} | {r['compute_wall_s'] * 1e3:.2f} | "
                     f"{(r['step_s'] - r['compute_wall_s']) * 1e3:.1f} | "
                     f"{r['bytes_per_step']:.0f} | {ring} | {ratio} |")
    rate = payload / comm
    body = [f"Digits run, {params} parameters, {settings.steps} steps, batch {settings.hp.batch} "
            f"({settings.hp.n_micro} micro-batches). All runs ended on one hash "
            f"({'yes' if len(hashes) == 1 else 'NO'}).", "", *lines, "",
            "Wire bytes are everything all peers sent on the data channels per step (contributions "
            "up to the coordinator, totals down, control); the float32 baseline is a ring "
            "all-reduce, 2(N-1) x 4 bytes x parameters in total. The peers run in this one "
            "process (one event loop, one shared compute thread, one GIL): all-reduce + waiting "
            "is step minus the compute wall time; bench/scaling.py runs each peer as its own "
            "process on its own core. The train-loop row is the plain contribute + apply loop "
            "of `daisychain train` in the same process. One BLAS thread (as daisy-peer now sets "
            "for its compute thread): with OpenBLAS's own threads the 1-peer row showed 59 ms of "
            "compute per step, the compute thread waiting on spinning BLAS workers.", "",
            f"2 peers: all-reduce payload rate {rate / 1e6:.2f} MB/s (payload / (step - compute)) vs a "
            f"raw data-channel transfer of the same {payload:.0f} bytes in the same run "
            f"{raw / 1e6:.2f} MB/s: {rate / raw * 100:.0f}%. Small payloads are latency-bound: "
            "a step is a few round trips of small messages.", ""]
    if gloo:
        body.append(f"torch.distributed Gloo all-reduce of the same payload ({params} float32, 2 "
                    f"processes, loopback): {gloo * 1e3:.2f} ms; DaisyChain's all-reduce + waiting "
                    f"at 2 peers: {comm * 1e3:.2f} ms ({comm / gloo:.1f}x Gloo).")
    joins = [r["join_s"] for r in rows if r["join_s"]]
    if joins:
        body.append(f"\nJoin to first contribution (process start of the node to its first "
                    f"computed contribution, incl. signaling, ICE, identity check, capacity "
                    f"measurement): {np.mean(joins):.2f} s on average.")
    text = "\n".join(body)
    print(text)
    write_section("mesh", text, "python -m bench.mesh " + " ".join(
        a for a in os.sys.argv[1:]))


if __name__ == "__main__":
    main()

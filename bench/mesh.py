"""Mesh benchmark: N in-process daisy-peers (real aiortc on loopback, the real server) train
the default digits run. Reports steps/s for 1..4 peers, the step time split, bytes on the
wire per step against a float32 all-reduce of the same gradient, the all-reduce payload rate
against a raw data-channel transfer of the same bytes in the same run, a torch.distributed
Gloo all-reduce of the same payload on loopback, and join-to-first-contribution time.

    .venv/bin/python -m bench.mesh [--steps 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import numpy as np

from bench._report import write_section
from daisychain.engine.settings import add_run_arguments, settings_from_args


async def mesh_run(settings, n: int):
    from daisychain.peer.demo import _serve
    from daisychain.peer.node import Node, NodeOptions
    from daisychain.peer import run as R

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
    compute = max(r["compute_s"] for r in results) / settings.steps
    sent = sum(r["bytes_sent"] for r in results) / settings.steps
    joins = [m.stats.first_contribution_s for m in members if m.stats.first_contribution_s]
    return {"n": n, "step_s": wall, "compute_s": compute, "bytes_per_step": sent,
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
    comm = max(two["step_s"] - two["compute_s"], 1e-9)
    payload = two["bytes_per_step"]
    raw = asyncio.run(raw_rate(int(payload)))
    gloo = gloo_allreduce_s(params)
    lines = ["| peers | steps/s | step ms | compute ms | all-reduce + waiting ms | wire bytes/step "
             "| float32 ring all-reduce bytes | ratio |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ring = 2 * (r["n"] - 1) * f32
        ratio = f"{r['bytes_per_step'] / ring * 100:.0f}%" if ring else "n/a (1 peer)"
        lines.append(f"| {r['n']} | {1 / r['step_s']:.1f} | {r['step_s'] * 1e3:.1f} | "
                     f"{r['compute_s'] * 1e3:.1f} | {(r['step_s'] - r['compute_s']) * 1e3:.1f} | "
                     f"{r['bytes_per_step']:.0f} | {ring} | {ratio} |")
    rate = payload / comm
    body = [f"Digits run, {params} parameters, {settings.steps} steps, batch {settings.hp.batch} "
            f"({settings.hp.n_micro} micro-batches). All runs ended on one hash "
            f"({'yes' if len(hashes) == 1 else 'NO'}).", "", *lines, "",
            "Wire bytes are everything all peers sent on the data channels per step (contributions "
            "up to the coordinator, totals down, control); the float32 baseline is a ring "
            "all-reduce, 2(N-1) x 4 bytes x parameters in total.", "",
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

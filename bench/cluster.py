"""Cluster benchmark: ``daisychain cluster`` on 1, 2 and 3 ranks over loopback Gloo, against
a float32 torch DDP step of the same model and global batch, and against the WebRTC mesh
(``bench.mesh``'s in-process daisy-peers) on the same run settings, all in the same run.

    .venv/bin/python -m bench.cluster [--steps 60] [--max-ranks 3]

Every rank is a process started with MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK (the
no-torchrun path), ``OMP_NUM_THREADS=1``, and pinned with ``taskset`` to core ``rank`` when
the world size is at most the number of cores (unpinned otherwise). Capacities are fixed
(``--capacity 1``: an even split), so the split does not depend on a noisy measurement.

* cluster: rank 0's steps/s over the training loop (start-up excluded) and its time in the
  int64 gradient ``all_reduce`` per step (which includes waiting for the slowest rank).
* DDP: ``torch.nn.parallel.DistributedDataParallel`` over the same float32 layers
  (``daisychain.export``'s module), Adam, each rank the same number of samples as its
  cluster share; steps/s, and a bare float32 ``all_reduce`` of the parameter count per step.
* mesh: ``bench.mesh.mesh_run`` (real server, real aiortc on loopback): steps/s and
  step time minus compute (all-reduce + waiting).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time

from bench._report import write_section

CAPACITY = "1"
T0 = 0.0


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _launch(argv: list[str], n: int, pin: bool, timeout: float = 300) -> list[str]:
    """Start n ranks of ``python argv`` with the env-var rendezvous; stdout of each rank."""
    port = _free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n),
                   RANK=str(r), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        cmd = ([*(["taskset", "-c", str(r)] if pin else []), sys.executable, *argv])
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise SystemExit(f"a rank failed ({' '.join(argv)}):\n{err[-3000:]}")
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


def cluster_run(run_flags: list[str], n: int, pin: bool) -> dict:
    out = _launch(["-m", "daisychain.cluster", "--json", "--quiet", "--capacity", CAPACITY,
                   *run_flags], n, pin)
    return json.loads(out[0].strip().splitlines()[-1])


def ddp_run(run_flags: list[str], n: int, pin: bool) -> dict:
    out = _launch(["-m", "bench.cluster", "--ddp-worker", *run_flags], n, pin)
    return json.loads(out[0].strip().splitlines()[-1])


def ddp_worker(args) -> None:
    """One rank of the float32 DDP baseline (started by ``ddp_run``)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from daisychain.engine.settings import settings_from_args
    from daisychain.engine.trainer import capacity_split
    from daisychain.export import _module_class

    torch.set_num_threads(1)
    rs = settings_from_args(args)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rs.hp.seed)
    model = _module_class()(rs.spec)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=rs.hp.lr)
    share = capacity_split(list(range(rs.hp.n_micro)), [1.0] * world)[rank]
    mine = len(share) * rs.hp.micro_batch
    dense = rs.spec.input_kind == "dense"
    x_all = torch.tensor(rs.ds.x_train, dtype=torch.float32 if dense else torch.int64)
    y_all = torch.tensor(rs.ds.y_train, dtype=torch.int64)
    rng = np.random.default_rng(rs.hp.seed + rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    params = sum(p.numel() for p in model.parameters())

    def step():
        idx = torch.from_numpy(rng.integers(0, len(y_all), max(mine, 1)))
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x_all[idx]), y_all[idx])
        loss.backward()  # DDP all-reduces the float32 gradient in here
        opt.step()

    for _ in range(3):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(rs.steps):
        step()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    buf = torch.ones(params, dtype=torch.float32)
    dist.barrier()
    t1 = time.perf_counter()
    for _ in range(rs.steps):
        dist.all_reduce(buf)
    ar = (time.perf_counter() - t1) / max(rs.steps, 1)
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"steps_per_s": rs.steps / elapsed, "allreduce_s": ar, "params": params}))


def main() -> None:
    from daisychain.engine.settings import add_run_arguments, settings_from_args

    ap = argparse.ArgumentParser()
    add_run_arguments(ap, steps=60)
    ap.add_argument("--max-ranks", type=int, default=3)
    ap.add_argument("--no-mesh", action="store_true", help="leave out the WebRTC mesh column")
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ddp_worker:
        ddp_worker(args)
        return
    global T0
    T0 = time.perf_counter()
    settings = settings_from_args(args)
    run_flags = [a for a in sys.argv[1:] if a not in ("--no-mesh",)]
    skip = {"--max-ranks"}
    run_flags = [a for i, a in enumerate(run_flags)
                 if a not in skip and (i == 0 or run_flags[i - 1] not in skip)]
    if "--steps" not in run_flags:
        run_flags += ["--steps", str(settings.steps)]
    from daisychain.engine.cli import train

    reference = train(settings, quiet=True)["params_sha256"]
    cores = len(os.sched_getaffinity(0))
    rows = []
    for n in range(1, args.max_ranks + 1):
        pin = n <= cores
        c = cluster_run(run_flags, n, pin)
        d = ddp_run(run_flags, n, pin)
        m = None
        if not args.no_mesh:
            from bench.mesh import mesh_run

            m = asyncio.run(mesh_run(settings, n))
        rows.append((n, pin, c, d, m))
        print(f"{n} ranks: cluster {c['steps_per_s']:.1f} steps/s, all-reduce "
              f"{c['allreduce_s_per_step'] * 1e3:.2f} ms; DDP {d['steps_per_s']:.1f} steps/s"
              + (f"; mesh {1 / m['step_s']:.1f} steps/s" if m else ""), file=sys.stderr)
    params = rows[0][3]["params"]
    lines = ["| ranks | pinned | cluster steps/s | cluster all-reduce ms/step | float32 DDP steps/s "
             "| cluster / DDP | float32 all-reduce ms (Gloo, same size) | WebRTC mesh steps/s "
             "| mesh all-reduce + waiting ms | cluster / mesh | hash = train |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, pin, c, d, m in rows:
        wait = (f"{(m['step_s'] - m['compute_s']) * 1e3:.1f}" if m and n > 1 else "n/a (1 peer)")
        mesh_cols = (f"{1 / m['step_s']:.1f} | {wait} | {c['steps_per_s'] * m['step_s']:.1f}x"
                     if m else "- | - | -")
        same = c["params_sha256"] == reference and (m is None or m["hash"] == reference)
        lines.append(f"| {n} | {'yes' if pin else 'no'} | {c['steps_per_s']:.1f} | "
                     f"{c['allreduce_s_per_step'] * 1e3:.2f} | {d['steps_per_s']:.1f} | "
                     f"{c['steps_per_s'] / d['steps_per_s']:.2f} | {d['allreduce_s'] * 1e3:.2f} | "
                     f"{mesh_cols} | {'yes' if same else 'NO'} |")
    hp = settings.hp
    body = [f"{settings.ds.task} run, {params} parameters, {settings.steps} steps, batch "
            f"{hp.batch} ({hp.n_micro} micro-batches of {hp.micro_batch}), even split "
            f"(`--capacity {CAPACITY}` on every rank). This machine has {cores} cores, shared with "
            f"other work while this ran: with more ranks than cores the ranks share cores "
            f"(pinned: no), so 3 ranks measure contention as much as the transport.", "", *lines,
            "",
            "cluster all-reduce is rank 0's time inside the int64 gradient `all_reduce` per step, "
            "waiting for the slowest rank included. DDP: the same float32 layers, Adam, the same "
            "samples per rank (its all-reduce runs inside backward); the float32 all-reduce "
            "column is a bare Gloo `all_reduce` of the parameter count, per call. The mesh "
            "columns are `bench.mesh`'s in-process daisy-peers over real aiortc on loopback "
            "with the same settings; the ratio is cluster steps/s over mesh steps/s. At 1 rank "
            "the all-reduce columns are the cost of the call alone. On a loaded machine a "
            "collective between compute steps costs far more than the same call in a tight "
            "loop (the float32 column): the rank waits for the scheduler to wake Gloo's "
            "thread, and then for the slowest rank.",
            "", f"The whole benchmark took {time.perf_counter() - T0:.0f} s wall here (process "
            "start-ups of every rank included; the machine was loaded)."]
    write_section("cluster", "\n".join(body),
                  command="python -m bench.cluster " + " ".join(sys.argv[1:]))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

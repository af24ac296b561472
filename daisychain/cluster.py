"""``daisychain cluster``: train on several machines without browsers, over torch.distributed
(Gloo), with the same bits as ``daisychain train``.

    torchrun --standalone --nproc-per-node 3 -m daisychain.cluster --steps 40 --seed 5
    torchrun --nnodes 4 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        --max-restarts 3 -m daisychain.cluster --save-checkpoint run.pt --save-every 50
    MASTER_ADDR=HOST MASTER_PORT=29500 WORLD_SIZE=2 RANK=0 daisychain cluster   # no torchrun

Each rank measures its capacity (micro-batches per second), the ranks all-gather the
capacities and agree on one split of every step's micro-batches (the engine's
``capacity_split``), each computes its share with the numpy INT8 engine, the int64
fixed-point gradient is summed with one ``all_reduce`` (integer addition: exact in any
order), and every rank applies the same deterministic Adam. Rank 0 prints the progress bar,
the unit-invocation counts and ``params-sha256:``, equal to ``daisychain train``'s with the
same run settings whatever the world size; every rank checks that it ends on that hash.

Ranks exchange only tensors (never pickled objects). ``GLOO_SOCKET_IFNAME`` picks the
network interface, as for any Gloo job. ``--save-checkpoint PATH --save-every N`` makes rank 0
write the run state (the ``.pt`` of ``daisy-peer``) every N steps; when torchrun's elastic
agent restarts the group after a failure (``--max-restarts``), rank 0 reads the last state,
sends its bytes to every rank, and each rank checks it (format, run identity, parameter hash)
before the run goes on. ``--resume PATH`` starts a run from any checkpoint of the same run
(one made by daisy-peer or downloaded from a browser room included).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from daisychain.engine.settings import (USER_ERRORS, ArgumentParser, add_run_arguments, capacity_arg,
                                       setting_type, settings_from_args)

#: A TESTING FAULT, for the fault-tolerance tests only: ``RANK:STEP`` makes that rank exit
#: abruptly (``os._exit(17)``, no clean-up) when it reaches STEP on the group's first attempt
#: (``TORCHELASTIC_RESTART_COUNT`` 0), as if its machine had died.
FAULT_ENV = "DAISYCHAIN_TEST_FAULT"


class ClusterError(RuntimeError):
    """A cluster run that cannot start or go on, with a message for the user."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p)
    g = p.add_argument_group("cluster")
    g.add_argument("--capacity", type=capacity_arg, default=None, metavar="auto|N",
                   help="this rank's micro-batches per second (default auto: measured)")
    g.add_argument("--timeout", type=setting_type("timeout"), default=300.0, metavar="S",
                   help="seconds a collective may wait for the other ranks (default 300)")
    g.add_argument("--gemm", default="fast", choices=["fast", "lut"],
                   help="unit GEMM: exact BLAS (fast) or every product from the table (lut)")
    c = p.add_argument_group("checkpoints")
    c.add_argument("--save-checkpoint", metavar="PATH", default=None,
                   help="rank 0 writes the run state as a .pt (the daisy-peer format) at the end")
    c.add_argument("--save-every", type=setting_type("save_every"), default=0, metavar="N",
                   help="with --save-checkpoint: also every N steps; a group restarted by "
                        "torchrun's elastic agent goes on from the last one (default 0: only at the end)")
    c.add_argument("--resume", metavar="PATH", default=None,
                   help="start from this .pt (read by rank 0, checked on every rank); --steps is "
                        "the run's total")
    p.add_argument("--json", action="store_true", help="rank 0 prints one JSON object instead")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


# --------------------------------------------------------------------------- process group


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ClusterError(f"{name}={v!r} is not an integer") from None


def init_group(timeout_s: float):
    """Join the process group: torchrun's or the MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK
    environment; a lone process (none of them set) is a group of one."""
    import torch.distributed as dist

    world, rank = _env_int("WORLD_SIZE"), _env_int("RANK")
    timeout = datetime.timedelta(seconds=timeout_s)
    if world is None and rank is None:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
        return dist
    if world is None or rank is None:
        raise ClusterError("set both WORLD_SIZE and RANK (or start the ranks with torchrun)")
    if world < 1 or not 0 <= rank < world:
        raise ClusterError(f"RANK must lie in [0, WORLD_SIZE - 1]; got RANK={rank}, "
                           f"WORLD_SIZE={world}")
    missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(n)]
    if missing:
        raise ClusterError(f"{' and '.join(missing)} not set: every rank needs the address and "
                           "port of rank 0 (or start the ranks with torchrun)")
    port = _env_int("MASTER_PORT")
    if not 0 < port < 65536:
        raise ClusterError(f"MASTER_PORT={port} is not a TCP port")
    ifname = os.environ.get("GLOO_SOCKET_IFNAME")
    if ifname:
        import psutil

        have = psutil.net_if_addrs()
        unknown = [n for n in ifname.split(",") if n not in have]
        if unknown:
            raise ClusterError(f"GLOO_SOCKET_IFNAME names no interface of this machine: "
                               f"{', '.join(unknown)} (it has {', '.join(sorted(have))})")
    try:
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # torchrun's agent hosts the store and keeps the SAME store (same port) across
            # the restarts of --max-restarts, while torch's env:// handler assumes a fresh one
            # per attempt and adds no prefix: a restarted group then reads the Gloo addresses
            # the dead attempt left there and waits for them forever in connectFullMesh.
            # One key prefix per attempt keeps each attempt's rendezvous its own.
            attempt = _env_int("TORCHELASTIC_RESTART_COUNT") or 0
            base = dist.TCPStore(os.environ["MASTER_ADDR"], port, world, is_master=False,
                                 timeout=timeout, wait_for_workers=False)
            store = dist.PrefixStore(f"daisychain/attempt_{attempt}", base)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                    timeout=timeout)
        else:
            dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    except (RuntimeError, ValueError, OSError) as exc:
        raise ClusterError(f"cannot join the process group at {os.environ['MASTER_ADDR']}:"
                           f"{port}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    return dist


def _gather_bytes(dist, data: bytes) -> list[bytes]:
    """all_gather of a short byte string of the same length on every rank."""
    import torch

    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [bytes(o.numpy().tobytes()) for o in out]


def _broadcast_file(dist, path: str | None, rank: int) -> bytes:
    """Rank 0 reads ``path`` and sends its bytes to every rank (as a uint8 tensor). A read
    error on rank 0 is raised on every rank."""
    import torch

    from daisychain.engine.checkpoint import MAX_BYTES

    data, problem = b"", ""
    if rank == 0:
        try:
            data = Path(path).read_bytes()
            if len(data) > MAX_BYTES:
                problem = f"{path} is {len(data)} bytes, more than {MAX_BYTES}"
        except OSError as exc:
            problem = f"cannot read {path}: {exc.strerror or exc}"
    head = torch.tensor([len(data) if not problem else -1], dtype=torch.int64)
    dist.broadcast(head, 0)
    if int(head) < 0:
        raise ClusterError(problem or "rank 0 cannot read the checkpoint")
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if rank == 0 and data else \
        torch.empty(int(head), dtype=torch.uint8)
    if int(head):
        dist.broadcast(buf, 0)
    return bytes(buf.numpy().tobytes())


# --------------------------------------------------------------------------- the run


def _resume_source(dist, args, rank: int) -> tuple[str | None, str]:
    """(path, why) of the state to start from: after an elastic restart the last state
    rank 0 saved (if it saved one yet), else ``--resume``."""
    import torch

    restarts = _env_int("TORCHELASTIC_RESTART_COUNT") or 0
    if restarts > 0 and args.save_checkpoint:
        # rank 0 decides: the other ranks may not see its file system
        have = torch.tensor([int(rank == 0 and Path(args.save_checkpoint).exists())])
        dist.broadcast(have, 0)
        if int(have):
            return args.save_checkpoint, f"restart {restarts}: the last saved state"
    return args.resume, "--resume"


def _load_state(dist, tr, path: str, steps: int, rank: int) -> int:
    """Every rank loads the checkpoint rank 0 read, checked here; returns its step."""
    from daisychain.engine.checkpoint import CheckpointError, load_checkpoint
    from daisychain.engine.trainer import TrainState

    data = _broadcast_file(dist, path, rank)
    try:
        ck = load_checkpoint(data, tr.identity)
    except CheckpointError as exc:
        raise ClusterError(f"cannot resume from {path}: {exc}") from None
    if ck.step > steps:
        raise ClusterError(f"cannot resume: {path} is at step {ck.step}, past --steps {steps} "
                           "(the run's total)")
    tr.load(ck.local if tr.hp.local else TrainState(ck.theta, ck.adam, ck.step))  # the seam's loader
    if tr.params_sha256() != ck.params_sha256:  # load_checkpoint checked the file; this the copy
        raise ClusterError("the loaded parameters do not hash to the checkpoint's hash")
    return ck.step


def _agree(dist, what: str, mine: bytes) -> None:
    """Raise ClusterError if the ranks hold different ``mine`` (same length everywhere)."""
    got = _gather_bytes(dist, mine)
    if len(set(got)) != 1:
        groups = {}
        for r, g in enumerate(got):
            groups.setdefault(g.hex()[:12], []).append(r)
        raise ClusterError(f"the ranks disagree on the {what}: " + "; ".join(
            f"ranks {v} have {k}" for k, v in groups.items()))


def _save(path, tr) -> None:
    """Write the trainer's state (a local-steps run's whole round state) to ``path``."""
    from daisychain.engine.checkpoint import write_checkpoint_file

    st = tr.state
    write_checkpoint_file(path, tr.identity, st.step, st.theta, getattr(st, "adam", None),
                          tr.ds.meta.get("vocab"), st if tr.hp.local else None)


def run_cluster(rs, args, dist) -> dict:
    """Train on this rank of the group; the same result dict on every rank."""
    import torch

    from daisychain.engine.counters import unit_counts
    from daisychain.engine.capacity import measure_capacity
    from daisychain.engine.local import make_trainer
    from daisychain.engine.trainer import capacity_split
    from daisychain.units import load_luts

    rank, world = dist.get_rank(), dist.get_world_size()
    tr = make_trainer(rs.spec, rs.hp, rs.ds, load_luts(), args.gemm)  # local steps: tasks are replicas
    # every rank must be in the same run: same settings flags, data, tables, engine
    _agree(dist, "run (settings, data, unit tables or engine version differ)",
           bytes.fromhex(tr.run_id))
    start, resumed = 0, None
    path, why = _resume_source(dist, args, rank)
    if path:
        start = _load_state(dist, tr, path, rs.steps, rank)
        resumed = {"path": path, "why": why, "step": start}
    _agree(dist, "parameters at the start", bytes.fromhex(tr.params_sha256()))

    cap = args.capacity if args.capacity else measure_capacity(tr)
    caps_t = torch.tensor([float(cap)], dtype=torch.float64)
    caps = [torch.empty_like(caps_t) for _ in range(world)]
    dist.all_gather(caps, caps_t)
    capacities = [float(c) for c in caps]
    shares = capacity_split(list(range(tr.n_tasks)), capacities)
    mine = shares[rank]

    fault = os.environ.get(FAULT_ENV)
    fault_step = None
    if fault and (_env_int("TORCHELASTIC_RESTART_COUNT") or 0) == 0:
        f_rank, _, f_step = fault.partition(":")
        if f_rank.isdigit() and f_step.isdigit() and int(f_rank) == rank:
            fault_step = int(f_step)

    show = rank == 0 and not (args.quiet or args.json)
    if show:
        print(f"cluster: {world} rank{'s' if world > 1 else ''} (gloo), capacities "
              f"{', '.join(f'{c:.0f}' for c in capacities)} micro-batches/s -> micro-batches "
              f"per step {', '.join(str(len(s)) for s in shares)}"
              + (f"; resumed at step {start} ({resumed['why']}: {resumed['path']})" if resumed else ""),
              file=sys.stderr, flush=True)
    from tqdm import tqdm

    g = torch.zeros(tr.total_size, dtype=torch.int64)
    loss_t = torch.zeros(2, dtype=torch.float64)
    loss = float("nan")
    allreduce_s = 0.0
    saves = 0
    t0 = time.perf_counter()
    with tqdm(total=rs.steps, initial=start, desc=f"cluster x{world}", unit="step",
              disable=not show, leave=False) as bar:
        for step in range(start, rs.steps):
            if step == fault_step:  # TESTING FAULT (see FAULT_ENV): this rank dies here
                os._exit(17)
            res = tr.contribute(mine)
            g.copy_(torch.from_numpy(res.grad))
            ta = time.perf_counter()
            dist.all_reduce(g)  # int64 sum: exact
            allreduce_s += time.perf_counter() - ta
            tr.apply(g.numpy())
            last = step == rs.steps - 1
            if step % 20 == 0 or last:  # display only: the mean loss of the step
                loss_t[0], loss_t[1] = float(res.loss.sum()), float(res.loss.size)
                dist.all_reduce(loss_t)
                loss = float(loss_t[0] / loss_t[1]) if loss_t[1] else float("nan")
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            bar.update(1)
            done = tr.state.step
            if (args.save_checkpoint and rank == 0 and args.save_every
                    and done % args.save_every == 0 and not last):
                _save(args.save_checkpoint, tr)
                saves += 1
    elapsed = time.perf_counter() - t0
    ran = rs.steps - start
    sha = tr.params_sha256()
    _agree(dist, "final parameters", bytes.fromhex(sha))
    if args.save_checkpoint and rank == 0:
        _save(args.save_checkpoint, tr)
        saves += 1
    per = rs.hp.n_micro * rs.hp.sync_every if rs.hp.local else 1  # micro-batches of a task
    counts_total = unit_counts(rs.spec, rs.hp.micro_batch, ran * tr.n_tasks * per)
    per_rank = [unit_counts(rs.spec, rs.hp.micro_batch, ran * len(s) * per) for s in shares]
    acc = tr.accuracy("test") if rank == 0 else float("nan")
    dist.barrier()
    return {"task": rs.ds.task, "steps": rs.steps, "seed": rs.hp.seed, "world_size": world,
            "rank": rank, "start_step": start, "resumed": resumed,
            "capacities": capacities, "micro_per_step": [len(s) for s in shares],
            "accuracy": acc, "test_mse": tr.mse("test") if rank == 0 else None,
            "loss": loss, "params_sha256": sha, "run_id": tr.run_id,
            "steps_per_s": ran / elapsed if elapsed > 0 and ran else 0.0,
            "allreduce_s_per_step": allreduce_s / ran if ran else 0.0,
            "units": counts_total, "units_per_rank": per_rank,
            "checkpoint": args.save_checkpoint if saves else None, "saves": saves,
            "identity": tr.identity}


def print_result(out: dict, as_json: bool) -> None:
    from daisychain.engine.counters import format_counts

    if as_json:
        print(json.dumps(out), flush=True)
        return
    print(format_counts(out["units"]) + f"  ({out['steps'] - out['start_step']} steps, "
          f"{out['world_size']} rank{'s' if out['world_size'] > 1 else ''})")
    for r, c in enumerate(out["units_per_rank"]):
        print(f"  rank {r}: " + format_counts(c)[len("units: "):])
    score = (f"test mse: {out['test_mse']:.6g}" if out.get("test_mse") is not None
             else f"test accuracy: {out['accuracy'] * 100:.2f}%")
    print(f"{score}  loss: {out['loss']:.4f}  "
          f"({out['steps']} steps, {out['steps_per_s']:.1f} steps/s, all-reduce "
          f"{out['allreduce_s_per_step'] * 1e3:.2f} ms/step)")
    if out["checkpoint"]:
        print(f"checkpoint: {out['checkpoint']} (step {out['steps']})")
    print(f"params-sha256: {out['params_sha256']}", flush=True)


def run(args: argparse.Namespace) -> int:
    if args.save_every < 0 or (args.save_every and not args.save_checkpoint):
        print("daisychain cluster: error: " + ("--save-every must be >= 0" if args.save_every < 0
              else "--save-every needs --save-checkpoint PATH"), file=sys.stderr)
        return 2
    if not args.timeout > 0:
        print("daisychain cluster: error: --timeout must be > 0", file=sys.stderr)
        return 2
    try:
        rs = settings_from_args(args)
    except USER_ERRORS as exc:
        print(f"daisychain cluster: error: {exc}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    dist = None
    try:
        dist = init_group(args.timeout)
        out = run_cluster(rs, args, dist)
    except ClusterError as exc:
        rank = os.environ.get("RANK", "0")
        print(f"daisychain cluster: rank {rank}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except RuntimeError as exc:  # a collective failed: another rank died or hung
        text = str(exc)
        if not (isinstance(exc, getattr(dist, "DistError", ())) or "gloo" in text.lower()):
            raise
        rank = os.environ.get("RANK", "0")
        first = text.splitlines()[0] if text else type(exc).__name__
        print(f"daisychain cluster: rank {rank}: error: the group lost a rank or timed out "
              f"({first[:300]})" + ("; torchrun's elastic agent restarts the group if "
                                    "--max-restarts allows" if os.environ.get(
                                        "TORCHELASTIC_RUN_ID") else ""),
              file=sys.stderr, flush=True)
        return 1
    finally:
        if dist is not None and dist.is_initialized():
            dist.destroy_process_group()
    if out["rank"] == 0:
        print_result(out, args.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="daisychain cluster", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""The single-process reference trainer: trains through the INT8 units and prints the test
accuracy (on the test split), the last training batch's loss and ``params-sha256: <hex>``,
the hash every peer of the same run prints.

``--workers K --assign ...`` simulates K peers in this one process (each computes only its
own micro-batches; their integer sums are added in a shuffled order): the hash must not
change. ``--float`` trains the same model in plain float32 (torch), for accuracy only.

With local steps (``--replicas R --sync-every H``, daisychain/engine/local.py) a step is a
round: ``--steps`` counts rounds, the K simulated peers share each round's replicas and each
inner step's micro-batches (``--assign``), and the hash must not change either.

``--save-checkpoint PATH`` writes the run's state as a ``.pt`` (the daisy-peer format, read
by ``--resume`` of every command and by ``daisychain export`` / ``sample``) at the end and
every ``--save-every`` steps; ``--resume PATH`` goes on from one to ``--steps`` (the run's
total), ending on the same hash as the uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from tqdm import tqdm

from daisychain.engine.settings import USER_ERRORS, add_run_arguments, setting_type, settings_from_args
from daisychain.engine.procs import ComputeWorkerError
from daisychain.engine.threads import add_threads_argument, threads_from


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p)
    p.add_argument("--workers", type=setting_type("workers"), default=1, help="simulated peers (default 1)")
    p.add_argument("--assign", default="round-robin", choices=["round-robin", "random", "capacity"],
                   help="how micro-batches are assigned to the simulated peers")
    p.add_argument("--gemm", default="fast", choices=["fast", "lut"],
                   help="unit GEMM: exact BLAS (fast) or every product from the table (lut)")
    p.add_argument("--float", action="store_true", dest="float_mode",
                   help="plain float32 torch training of the same model (accuracy comparison)")
    add_threads_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    g = p.add_argument_group("checkpoints")
    g.add_argument("--save-checkpoint", metavar="PATH", default=None,
                   help="write the run's state as a .pt (torch.load reads it) at the end")
    g.add_argument("--save-every", type=setting_type("save_every"), default=0, metavar="N",
                   help="with --save-checkpoint: also every N steps (default 0: only at the end)")
    g.add_argument("--resume", metavar="PATH", default=None,
                   help="go on from this .pt of the same run (checked; another run's file is "
                        "refused with what differs); --steps is the run's total")


def _flag_errors(args: argparse.Namespace) -> str | None:
    """Flags that do not go together, in words (None: fine)."""
    if args.float_mode:
        given = [f for f, on in (("--workers", args.workers != 1), ("--gemm", args.gemm != "fast"),
                                 ("--save-checkpoint", args.save_checkpoint),
                                 ("--resume", args.resume)) if on]
        if given:
            return (f"--float trains plain float32 in one process: {', '.join(given)} "
                    f"{'does' if len(given) == 1 else 'do'} not apply to it")
    if args.save_every and not args.save_checkpoint:
        return "--save-every needs --save-checkpoint PATH"
    return None


def run(args: argparse.Namespace) -> int:
    from daisychain.engine.checkpoint import CheckpointError

    try:
        problem = _flag_errors(args)
        if problem:
            raise ValueError(problem)
        rs = settings_from_args(args)
    except (*USER_ERRORS, ValueError) as exc:
        print(f"daisychain train: error: {exc}", file=sys.stderr)
        return 2
    if args.float_mode:
        from daisychain.engine.floatref import train_float

        out = train_float(rs, quiet=args.quiet or args.json)
        if args.json:
            print(json.dumps(out))
        else:
            score = (f"test mse: {out['test_mse']:.6g}" if "test_mse" in out
                     else f"test accuracy: {out['accuracy'] * 100:.2f}%")
            print(f"float32 {score} (the test split)  last training batch's loss: {out['loss']:.4f}")
        return 0
    try:
        out = train(rs, args.workers, args.assign, args.gemm, quiet=args.quiet or args.json,
                    save=args.save_checkpoint, save_every=args.save_every, resume=args.resume,
                    threads=threads_from(args, "daisychain train"))
    except CheckpointError as exc:
        print(f"daisychain train: error: {exc}", file=sys.stderr)
        return 2
    except ComputeWorkerError as exc:  # a compute worker process died, failed or hung
        print(f"daisychain train: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"daisychain train: error: cannot write the checkpoint: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out))
    else:
        loss = "n/a" if out["loss"] is None else f"{out['loss']:.4f}"
        ran = out["steps"] - out["start_step"]
        unit = "rounds" if rs.hp.local else "steps"
        score = (f"test accuracy: {out['accuracy'] * 100:.2f}%" if out["test_mse"] is None
                 else f"test mse: {out['test_mse']:.6g}")
        print(f"{score}, test loss {out['test_loss']:.4f} (the test split)  last training batch's loss: {loss}  "
              f"({out['steps']} {unit}{f', {ran} of them now' if out['start_step'] else ''}, "
              f"{out['micro_batches_per_s']:.0f} micro-batches/s)")
        if out["checkpoint"]:
            print(f"checkpoint: {out['checkpoint']} ({unit[:-1]} {out['steps']})")
        print(f"params-sha256: {out['params_sha256']}")
    return 0


def train(rs, workers: int = 1, how: str = "round-robin", gemm: str = "fast",
          quiet: bool = False, save: str | None = None, save_every: int = 0,
          resume: str | None = None, threads: int = 1) -> dict:
    """Train to ``rs.steps`` (from ``resume``'s step when given); ``save``: write the state
    there every ``save_every`` steps and at the end; ``threads``: a step's micro-batches on
    that many threads (engine/threads.py, same bits). Raises CheckpointError."""
    return train_with_trainer(rs, workers, how, gemm, quiet, save, save_every, resume, threads)[0]


def train_with_trainer(rs, workers: int = 1, how: str = "round-robin", gemm: str = "fast",
                       quiet: bool = False, save: str | None = None, save_every: int = 0,
                       resume: str | None = None, threads: int = 1):
    """:func:`train`, and the trainer it ran (the Python API keeps it: daisychain/api.py)."""
    from daisychain.engine.checkpoint import CheckpointError, read_checkpoint_file, write_checkpoint_file
    from daisychain.engine.local import make_trainer
    from daisychain.engine.trainer import TrainState, assign
    from daisychain.units import load_luts

    tr = make_trainer(rs.spec, rs.hp, rs.ds, load_luts(), gemm, threads)
    local = rs.hp.local
    start = 0
    if resume:
        ck = read_checkpoint_file(resume, tr.identity)
        if ck.step > rs.steps:
            raise CheckpointError(f"{resume} is at step {ck.step}, past --steps {rs.steps} (the "
                                  f"run's total)")
        tr.load(ck.local if local else TrainState(ck.theta, ck.adam, ck.step))
        start = ck.step
    vocab = rs.ds.meta.get("vocab")

    def save_state():
        st = tr.state
        write_checkpoint_file(save, tr.identity, st.step, st.theta, getattr(st, "adam", None), vocab,
                              st if local else None)

    def split(s: int) -> list[list[int]]:  # a local run: an inner step's micro-batches
        return [p for p in assign(rs.hp.n_micro, workers, how, s, rs.hp.seed) if p]

    extra = {"split": split} if local else {}
    order_rng = np.random.default_rng(rs.hp.seed + 1)  # only shuffles summation order
    loss = None
    t0 = time.perf_counter()
    with tqdm(total=rs.steps - start, desc="train", unit="step", disable=quiet, leave=False) as bar:
        for step in range(start, rs.steps):
            parts = assign(tr.n_tasks, workers, how, step, rs.hp.seed)
            results = [tr.contribute(p, **extra) for p in parts]
            total = np.zeros(tr.total_size, np.int64)
            for k in order_rng.permutation(len(results)):
                total += results[k].grad
            tr.apply(total)
            loss = float(np.mean(np.concatenate([r.loss for r in results])))
            bar.update(1)
            if step % 20 == 0:
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            if save and save_every and (step + 1) % save_every == 0 and step + 1 < rs.steps:
                save_state()
    elapsed = time.perf_counter() - t0
    if save:
        save_state()
    ran = rs.steps - start
    return {"task": rs.ds.task, "steps": rs.steps, "start_step": start, "seed": rs.hp.seed,
            "checkpoint": save,
            "accuracy": tr.accuracy("test"), "loss": loss, "test_mse": tr.mse("test"),
            "test_loss": tr.test_loss("test"),
            "params_sha256": tr.params_sha256(), "run_id": tr.run_id,
            "dataset_fingerprint": rs.ds.fingerprint, "manifest_sha256": tr.luts.manifest_sha256,
            "workers": workers, "assign": how, "gemm": gemm, "threads": threads,
            "threads_used": getattr(getattr(getattr(tr, "base", tr), "threads", None), "most_used", 1),
            "processes_used": getattr(getattr(getattr(tr, "base", tr), "threads", None), "most_procs", 0),
            "micro_batches_per_s": ran * rs.hp.n_micro * (rs.hp.replicas * rs.hp.sync_every)
            / elapsed if elapsed > 0 else 0.0,
            "replicas": rs.hp.replicas, "sync_every": rs.hp.sync_every,
            "identity": tr.identity}, tr

"""Rollback window: what a coordinator holds to undo a caught liar (daisychain/peer/run/
rollback.py), measured on a real run. For each verify rate the window is ``window_steps(rate,
strikes)`` steps; the bench trains ``1.25 x window`` steps of the run single-process (as the
coordinator does: contribute, apply, ``Window.record``) and reports the window's memory
when full (the snapshot, three float64 vectors, and the encoded totals) against the same
totals as raw int64, and the time ``record`` adds to a step (encoding, and folding the
oldest quarter into the snapshot) against the time of the step itself, both in CPU time of
this process, in the same run (the codec's compiled loops are loaded first: a coordinator
has them from encoding its totals for the wire).

Run: ``python -m bench.window`` (writes a section of docs/RELIABILITY.md);
``python -m bench.window --rates 0.25 -- --hidden 32`` for other run settings.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import datetime, timezone

from bench.chaos import DOC, put_section
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.trainer import Trainer
from daisychain.peer.run.rollback import Window, window_steps
from daisychain.peer.run.state import tensor_bounds
from daisychain.units import load_luts

BEGIN, END = "<!-- bench/window.py: begin -->", "<!-- bench/window.py: end -->"


def measure(rs, rate: float, strikes: int) -> dict:
    k = window_steps(rate, strikes)
    tr = Trainer(rs.spec, rs.hp, rs.ds, load_luts())
    w = Window(k, tensor_bounds(tr))
    w.reset(tr)
    from daisychain.peer.intcodec import decode_ints, encode_ints
    from daisychain.peer.framing import Codec
    import numpy as np
    warm = np.ones(tr.layout.size, np.int64)  # the codec's compiled loops (the wire's too): not timed
    decode_ints(*encode_ints(warm, w.bounds, (Codec.NARROW, Codec.VARINT)), tr.layout.size)
    steps = k + max(1, k // 4) - 1   # the most it holds: full, before a fold
    folds = k + max(1, k // 4)       # one more: the first fold
    step_s = record_s = 0.0
    peak = 0
    for s in range(folds):
        t0 = time.process_time()
        total = tr.contribute(range(rs.hp.n_micro)).grad
        tr.apply(total)
        t1 = time.process_time()
        w.record(tr, s, total, {"m1"})
        t2 = time.process_time()
        step_s, record_s = step_s + t1 - t0, record_s + t2 - t1
        if s == steps - 1:
            peak = w.nbytes()
    size = tr.layout.size
    return {"rate": rate, "k": k, "held": steps, "params": size, "peak": peak,
            "raw": 3 * 8 * size + steps * 8 * size, "step_ms": 1e3 * step_s / folds,
            "record_ms": 1e3 * record_s / folds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="0.25,0.1,0.05", help="verify rates (default 0.25,0.1,0.05)")
    ap.add_argument("--strikes", type=int, default=3, help="strikes (default 3)")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/RELIABILITY.md")
    ap.add_argument("run", nargs="*", help="run settings after --, e.g. -- --hidden 32")
    args = ap.parse_args(argv)
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(args.run))
    rows = ["| --verify-rate | window (steps) | steps held at most | parameters | window memory "
            "(MB) | the same with raw int64 totals (MB) | ms per step | ms `record` adds per step |",
            "|---|---|---|---|---|---|---|---|"]
    for r in (float(x) for x in args.rates.split(",")):
        m = measure(rs, r, args.strikes)
        rows.append(f"| {r:g} | {m['k']} | {m['held']} | {m['params']} | {m['peak'] / 1e6:.2f} | "
                    f"{m['raw'] / 1e6:.2f} | {m['step_ms']:.2f} | {m['record_ms']:.3f} |")
    table = "\n".join(rows)
    print(table)
    if not args.no_write:
        cmd = "python -m bench.window " + " ".join(argv or sys.argv[1:])
        put_section(DOC, BEGIN, END, f"""{table}

{args.strikes} strikes; run settings `{' '.join(args.run) or "daisychain train's defaults"}`, {rs.hp.n_micro} micro-batches per step.
Command: `{cmd.strip()}`
Machine: {platform.machine()}, {os.cpu_count()} cores (shared with other work while it ran),
Python {platform.python_version()}, {datetime.now(timezone.utc):%Y-%m-%d}; CPU time of one process.""")
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Test accuracy of ``--task image`` runs: the INT8 engine (``daisychain train``) and torch
float32 (``train --float``) on the same settings, several runs at once, one thread each.

    python bench/image_recipe.py --jobs 8 --mode both -- "" "--lr 0.01" "--steps 6000"

Each positional argument is one run's extra ``daisychain train`` flags (after ``--task
image``; quote each). Prints one JSON line per run (``mode``, ``flags``, ``accuracy``,
``seconds``, and the engine's ``params_sha256``) and, with ``--out``, writes them to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def one(mode: str, flags: str) -> dict:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = "1"
    import torch

    torch.set_num_threads(1)
    from daisychain.engine.cli import train
    from daisychain.engine.settings import add_run_arguments, settings_from_args

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(["--task", "image", *shlex.split(flags)]))
    t0 = time.perf_counter()
    if mode == "float":
        from daisychain.engine.floatref import train_float

        out = train_float(rs, quiet=True)
    else:
        out = train(rs, quiet=True)
    return {"mode": mode, "flags": flags, "steps": rs.steps, "accuracy": out["accuracy"],
            "seconds": round(time.perf_counter() - t0, 1),
            "params_sha256": out.get("params_sha256"), "hyper": rs.hp.to_json(),
            "layers": [l.type for l in rs.spec.layers]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--mode", choices=["engine", "float", "both"], default="both")
    ap.add_argument("--out", type=Path)
    ap.add_argument("runs", nargs="*", default=[""])
    args = ap.parse_args(argv)
    modes = ["engine", "float"] if args.mode == "both" else [args.mode]
    work = [(m, f) for f in args.runs for m in modes]
    lines = []
    with ProcessPoolExecutor(args.jobs) as pool:
        futs = {pool.submit(one, m, f): (m, f) for m, f in work}
        for fut in as_completed(futs):
            try:
                res = fut.result()
            except Exception as exc:  # report and go on with the other runs
                res = {"mode": futs[fut][0], "flags": futs[fut][1], "error": repr(exc)}
            line = json.dumps(res)
            print(line, flush=True)
            lines.append(line)
            if args.out:
                args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

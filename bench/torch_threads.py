"""torch's intra-op pool on the image grad (issue 33, ``--threads 1``): one image-task Engine's
grad of a step's 4 micro-batches of 16 with torch's default thread count (one a core) and
with one thread, alternating rounds in one process, best of each. On a machine whose cores
other work holds, the default pool's threads wait for each other; engine/threads.py sets
one thread in every process (``--threads N``: N processes, one thread each).

Run: ``python -m bench.torch_threads [ROUNDS]``. Prints; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts

CALLS = 20


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(["--task", "image"]))
    tr = Trainer(rs.spec, rs.hp, rs.ds, load_luts(), threads=1)
    x, y = tr.inputs(0, np.arange(rs.hp.n_micro))
    default = torch.get_num_threads()
    best: dict[int, float] = {}
    for _ in range(rounds):
        for n in (default, 1):
            torch.set_num_threads(n)
            t = time.perf_counter()
            for _ in range(CALLS):
                tr.engine.grad(tr.theta, x, y, rs.hp.grad_frac_bits, tr.limit)
            best[n] = max(best.get(n, 0.0), CALLS / (time.perf_counter() - t))
    print(f"grads/s of a step's {rs.hp.n_micro} micro-batches, best of {rounds} alternating rounds of {CALLS}: "
          f"torch {default} threads (its default here) {best[default]:.1f}, 1 thread {best[1]:.1f} "
          f"({best[1] / best[default]:.2f}x); load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""A step's micro-batches computed concurrently (``--threads N`` of ``daisychain train``,
``demo``, ``cluster`` and ``daisy-peer``).

The micro-batches given to :meth:`ThreadedGrad.grad` are split into N contiguous runs, one
per thread, each computed by an Engine of its own (the fast paths keep scratch buffers, so
an Engine is never shared between threads). The kernels release the GIL (numba ``nogil``,
``torch._int_mm``, numpy's GEMMs), so the threads run on separate cores (torch's own
intra-op pool is set to one thread then, so that N threads use N cores, not N x cores). A contribution is a
sum of exact int64 fixed-point values, so the sum of the threads' sums is the same bits as
one thread's, in any order; loss and correct keep the micro-batch order. Every N gives the
same parameters hash (tests/engine/test_threads.py).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

#: The most threads accepted (a typo guard: more threads than cores is allowed, see note_threads).
MAX_THREADS = 256


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS says it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def threads_arg(text: str) -> int:
    """argparse ``type`` of ``--threads``: a whole number from 1 to MAX_THREADS, else one line."""
    import argparse

    try:
        n = int(str(text).strip())
    except ValueError:
        n = None
    if n is None or not 1 <= n <= MAX_THREADS:
        raise argparse.ArgumentTypeError(
            f"--threads must be a whole number in [1, {MAX_THREADS}] (default: this machine's "
            f"{cores()} cores), not {text!r}")
    return n


def note_threads(n: int) -> str | None:
    """The log line for more threads than cores (allowed: they share the cores), else None."""
    c = cores()
    if n > c:
        return f"--threads {n} is more than this machine's {c} cores: allowed, the threads share them"
    return None


class ThreadedGrad:
    """``grad(x, y, theta, frac_bits, limit)`` of n micro-batches on up to ``threads`` threads.

    ``make_engine()`` builds one more Engine (the first is the trainer's own)."""

    def __init__(self, first, make_engine: Callable, threads: int):
        self.threads = int(threads)
        self._engines = [first]
        self._make = make_engine
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="daisy-compute") if self.threads > 1 else None

    def grad(self, x: np.ndarray, y: np.ndarray, theta: np.ndarray, frac_bits: int, limit: float):
        from daisychain.engine.model import Result

        n = len(y)
        k = min(self.threads, n)
        if k <= 1:
            return self._engines[0].grad(theta, x, y, frac_bits, limit)
        while len(self._engines) < k:
            self._engines.append(self._make())
        torch = sys.modules.get("torch")  # the image path's torch._int_mm: one intra-op thread
        if torch is not None and torch.get_num_threads() != 1:  # each, or N threads oversubscribe
            torch.set_num_threads(1)
        cuts = [(w * n) // k for w in range(k + 1)]
        futures = [self._pool.submit(self._engines[w].grad, theta, x[cuts[w]:cuts[w + 1]],
                                     y[cuts[w]:cuts[w + 1]], frac_bits, limit) for w in range(k)]
        parts = [f.result() for f in futures]
        grad = parts[0].grad.copy()
        for p in parts[1:]:
            grad += p.grad
        return Result(grad, np.concatenate([p.loss for p in parts]), np.concatenate([p.correct for p in parts]))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def add_threads_argument(p) -> None:
    """``--threads N`` on a command's parser (train, demo, cluster, daisy-peer)."""
    p.add_argument("--threads", type=threads_arg, default=None, metavar="N",
                   help=f"compute a step's micro-batches on N threads, same bits for every N "
                        f"(default: this machine's cores, {cores()} here)")


def threads_from(args, prog: str) -> int:
    """The thread count of parsed ``args`` (default: the cores), saying on stderr when it is
    more than the cores."""
    import sys

    n = args.threads if getattr(args, "threads", None) else cores()
    note = note_threads(n)
    if note:
        print(f"{prog}: {note}", file=sys.stderr)
    return n

"""How fast this machine runs a run: micro-batches per second (the capacity a peer or a
cluster rank announces, which the split follows); for a local-steps run, tasks (replica
rounds) per second."""

from __future__ import annotations

import time

from daisychain.engine.trainer import Trainer


def measure_capacity(trainer: Trainer, seconds: float = 0.3) -> float:
    """Micro-batches per second of this machine on this run (a few step-0 micro-batches, as
    many at once as the trainer has threads (``--threads``), so the rate is all of them; a
    local-steps run's replica rounds at its last anchor, which need no replay). One untimed
    call first: a fresh process's first call loads the compiled kernels (from numba's cache,
    or compiles them, seconds, where the cache is cold) and makes its buffers, and counted it
    would understate the rate the split follows."""
    theta = trainer.theta.copy()
    step = getattr(trainer, "anchor_round", 0)
    k = max(1, min(trainer.n_tasks, getattr(getattr(trainer, "threads", None), "threads", 1)))
    trainer.contribute([i % trainer.n_tasks for i in range(k)], step, theta)
    n, t0 = 0, time.perf_counter()
    while True:
        trainer.contribute([(n + i) % trainer.n_tasks for i in range(k)], step, theta)
        n += k
        dt = time.perf_counter() - t0
        if dt > seconds or n >= 200:
            return n / dt

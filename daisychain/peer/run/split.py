"""How a step's micro-batches are shared: by capacity, or once a member's link is seen to
cost time, so that everyone finishes together; and how a machine's capacity is measured."""

from __future__ import annotations

import time

import numpy as np

from daisychain.engine.model import Result
from daisychain.engine.trainer import Trainer

def finish_shares(spm: list[float], fixed: list[float], n: int) -> list[float]:
    """Micro-batch shares (summing to ~n) with which every peer finishes a step at the same
    time T: peer k takes max(1, (T - fixed[k]) / spm[k]) micro-batches, where spm[k] is its
    seconds per micro-batch and fixed[k] the seconds its link adds to a step (the total
    reaching it, its contribution coming back). T by bisection (the same float operations
    as runpeer.js finishShares; shared cases in tests/scenarios/split.json)."""
    def taken(t: float) -> float:
        acc = 0.0
        for s, x in zip(spm, fixed):
            acc += max(1.0, (t - x) / s)
        return acc
    lo, hi = 0.0, max(fixed) + n * max(spm)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if taken(mid) >= n:
            hi = mid
        else:
            lo = mid
    return [max(1.0, (hi - x) / s) for s, x in zip(spm, fixed)]


def contribute_at(trainer: Trainer, theta: np.ndarray, step: int, micro) -> Result:
    """``Trainer.contribute`` on a given parameter vector (a snapshot, so that a compute in a
    thread never sees the replica change under it)."""
    ids = np.asarray(micro, np.int64)
    idx = np.stack([trainer.schedule.samples(step, int(j)) for j in ids])
    return trainer.engine.grad(theta, trainer.ds.x_train[idx], trainer.ds.y_train[idx],
                               trainer.hp.grad_frac_bits, trainer.limit)


def measure_capacity(trainer: Trainer, seconds: float = 0.3) -> float:
    """Micro-batches per second of this machine on this run (a few step-0 micro-batches)."""
    theta = trainer.theta.copy()
    n, t0 = 0, time.perf_counter()
    while True:
        contribute_at(trainer, theta, 0, [n % trainer.hp.n_micro])
        n += 1
        dt = time.perf_counter() - t0
        if dt > seconds or n >= 200:
            return n / dt



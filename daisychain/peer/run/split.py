"""How a step's micro-batches are shared: by capacity, or once a member's link is seen to
cost time, so that everyone finishes together (the capacity itself is measured by
:func:`daisychain.engine.capacity.measure_capacity`)."""

from __future__ import annotations

import time

import numpy as np

from daisychain.engine.capacity import measure_capacity  # noqa: F401  (re-exported)
from daisychain.engine.local import StaleRound
from daisychain.engine.model import Result
from daisychain.engine.trainer import Trainer, capacity_split


def finish_shares(spm: list[float], fixed: list[float], n: int) -> list[float]:
    """Micro-batch shares (summing to ~n) with which every peer finishes a step at the same
    time T: peer k takes max(1, (T - fixed[k]) / spm[k]) micro-batches, where spm[k] is its
    seconds per micro-batch and fixed[k] the seconds its link adds to a step (the total
    reaching it, its contribution coming back). T by bisection (the same float operations
    as webui/run/split.js finishShares; shared cases in tests/scenarios/split.json)."""
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


def split_tasks(ids: list[int], weights: list[float], live: list[str],
                last: dict[int, str] | None = None) -> tuple[list[list[int]], dict[int, str]]:
    """A step's parts, one per peer of ``live``: ``capacity_split`` of ``ids`` by ``weights``;
    with ``last`` (a local-steps run: replica -> the peer that computed it last round) the
    same count per peer, but each replica stays with its last peer while that peer has room
    (sticky replicas: its own moments, no replay from the anchor, engine/local.py), the
    others in order to the first peers with room left; each part ascending. Returns (parts,
    replica -> peer) (webui/run/split.js stickySplit; shared cases: tests/scenarios/split.json "sticky")."""
    parts = capacity_split(list(ids), weights)
    if last is not None:
        counts, parts, left = [len(p) for p in parts], [[] for _ in live], []
        for j in ids:
            k = live.index(last[j]) if last.get(j) in live else -1
            (parts[k] if k >= 0 and len(parts[k]) < counts[k] else left).append(j)
        k = 0
        for j in left:
            while len(parts[k]) >= counts[k]:
                k += 1
            parts[k].append(j)
        parts = [sorted(p) for p in parts]
    return parts, {j: peer for peer, p in zip(live, parts) for j in p}


def contribute_timed(trainer: Trainer, theta: np.ndarray, step: int, micro):
    """(:func:`contribute_at`, the seconds it took), timed in the thread that computes it (the
    shell's compute thread queues a step's tasks one after another; the split wants each
    compute's own seconds, not its wait behind the others)."""
    t0 = time.perf_counter()
    out = contribute_at(trainer, theta, step, micro)
    return out, time.perf_counter() - t0


def contribute_at(trainer: Trainer, theta: np.ndarray, step: int, micro) -> Result | None:
    """``Trainer.contribute`` of ``micro`` of ``step`` on ``theta`` (the shell's compute, in a
    thread: a copy of the parameters, so it never sees the replica change under it); None
    for a local-steps round the trainer no longer holds (the room moved past its anchor
    while the compute waited: a late result the coordinator would ignore anyway)."""
    try:
        return trainer.contribute(micro, step, theta)
    except StaleRound:
        return None

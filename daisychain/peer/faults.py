"""TESTING FAULTS: ``daisy-peer --fault MODE`` makes a peer a liar that corrupts the
contributions it sends, so that tests and ``bench/chaos.py`` can check that the spot-checks
(``run.py``) catch it. Off by default; a peer with a fault says so in its log."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from daisychain.peer import frames as F

log = logging.getLogger("daisychain.peer")

#: mode -> what the liar does to each contribution it sends
FAULTS = {
    "flip": "flips one bit of every contribution",
    "scale": "doubles every contribution",
    "random": "sends random integers instead of its contributions",
    "stale": "sends its previous contribution again (zeros at first)",
    "nan-meta": "writes NaN as the loss of every contribution (meta no receiver accepts)",
}


class Liar:
    def __init__(self, mode: str, seed: int = 7):
        if mode not in FAULTS:
            raise ValueError(f"unknown fault {mode!r}: one of {', '.join(FAULTS)}")
        self.mode = mode
        self.rng = np.random.default_rng(seed)
        self.last: np.ndarray | None = None

    def corrupt(self, m) -> tuple[object, bool]:
        """What the liar sends instead of ``m``, and whether its meta may hold NaN (only
        ``nan-meta``; ``frames.encode_frames(..., _allow_nan=True)``). Only contributions
        are corrupted."""
        if not isinstance(m, F.Contrib):
            return m, False
        ints = np.array(m.ints, np.int64)
        if self.mode == "flip":
            ints[m.step % ints.size] ^= 1 << 12
        elif self.mode == "scale":
            ints = ints * 2
        elif self.mode == "random":
            ints = self.rng.integers(-(1 << 20), 1 << 20, ints.size).astype(np.int64)
        elif self.mode == "stale":
            ints, self.last = (self.last if self.last is not None else np.zeros_like(ints)), ints
        else:  # nan-meta
            log.info("TESTING FAULT nan-meta: NaN loss in the contribution of task %d, step %d",
                     m.task, m.step)
            return dataclasses.replace(m, loss=float("nan")), True
        log.info("TESTING FAULT %s: corrupted the contribution of task %d, step %d",
                 self.mode, m.task, m.step)
        return dataclasses.replace(m, ints=ints), False

"""The rollback window of a coordinator: enough of the recent past to undo a caught liar's
unchecked contributions exactly.

A liar that lies on every contribution is caught by a spot-check of a step with probability
at least ``r`` (the verify rate); it is removed at its ``strikes``-th mismatch. The window
holds the last :func:`window_steps` steps, so that a liar is removed within the window
with probability at least 1 - 10**-6. It keeps one snapshot of the state at the window's
first step and the integer total of every committed step since (with who sent unchecked
contributions in it), each stored as the wire stores it (NARROW or VARINT, the smaller:
intcodec.py); going back to step S is loading the snapshot and applying the totals before S
again: the same bits as the run had at S. Steps older than the window are folded into the
snapshot a quarter window at a time (so it holds between ``size`` and 1.25 ``size`` steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daisychain.engine.trainer import Trainer, TrainState
from daisychain.peer.framing import Codec
from daisychain.peer.intcodec import decode_ints, encode_ints

#: the chance, at most, that a liar stays unremoved for longer than the window
ESCAPE = 1e-6
#: the longest window (steps), whatever the rate
MAX_WINDOW = 100_000


def window_steps(rate: float, strikes: int, escape: float = ESCAPE) -> int:
    """The smallest k with P(fewer than ``strikes`` of k steps checked) < ``escape``, each
    step checked with probability ``rate``: P = sum_{i<s} C(k,i) r^i (1-r)^(k-i). 0 when
    nothing is checked; at most MAX_WINDOW. (The same float operations as rollback.js.)"""
    if not rate > 0.0:
        return 0
    if rate >= 1.0:
        return int(strikes)
    q = 1.0 - rate
    qk = 1.0
    for _ in range(int(strikes)):
        qk *= q
    k = int(strikes)
    while k < MAX_WINDOW:
        # terms C(k,i) r^i q^(k-i) for i < strikes, from i = 0 (q^k) upward
        term, acc = qk, 0.0
        for i in range(int(strikes)):
            acc += term
            term = term * (k - i) / (i + 1) * rate / q
        if acc < escape:
            return k
        k += 1
        qk *= q
    return MAX_WINDOW


@dataclass
class _Step:
    step: int
    codec: int
    body: bytes            # the total, encoded (intcodec)
    unchecked: frozenset   # peers with a contribution in it that no spot-check confirmed

    def total(self, size: int) -> np.ndarray:
        return decode_ints(self.codec, self.body, size)


class Window:
    """The last ``size`` committed steps of this coordinator (see the module docstring)."""

    def __init__(self, size: int, bounds: list[int] | None = None):
        self.size = int(size)
        self.bounds = bounds
        self.base: TrainState | None = None
        self.steps: list[_Step] = []

    @property
    def first(self) -> int | None:
        """The earliest step the window can go back to."""
        return None if self.base is None else self.base.step

    def reset(self, trainer: Trainer) -> None:
        """Start the window at the replica's current state (a new term, a restore)."""
        self.base = trainer.snapshot() if self.size else None
        self.steps = []

    def record(self, trainer: Trainer, step: int, total: np.ndarray, unchecked) -> None:
        """``total`` was applied at ``step`` (``trainer`` is now at step + 1). Past 1.25 times
        the window, the oldest quarter is folded into the snapshot (applied to it)."""
        if self.base is None:
            return
        codec, body = encode_ints(np.asarray(total, np.int64), self.bounds, (Codec.NARROW, Codec.VARINT))
        self.steps.append(_Step(step, codec, body, frozenset(unchecked)))
        chunk = max(1, self.size // 4)
        if len(self.steps) >= self.size + chunk:
            old, self.steps = self.steps[:chunk], self.steps[chunk:]
            now = trainer.snapshot()
            trainer.load(self.base)
            for s in old:
                trainer.apply(s.total(now.theta.size))
            self.base = trainer.snapshot()
            trainer.load(now)

    def earliest(self, peer: str) -> int | None:
        """The first step in the window with an unchecked contribution of ``peer``."""
        return next((s.step for s in self.steps if peer in s.unchecked), None)

    def go_back(self, trainer: Trainer, step: int) -> None:
        """Load the state the run had at ``step`` (within the window) into ``trainer``, and
        forget the steps from there on."""
        trainer.load(self.base)
        keep = [s for s in self.steps if s.step < step]
        for s in keep:
            trainer.apply(s.total(self.base.theta.size))
        self.steps = keep

    def nbytes(self) -> int:
        """Memory the window holds: the snapshot and the totals."""
        if self.base is None:
            return 0
        b = self.base
        return b.theta.nbytes + b.adam.m.nbytes + b.adam.v.nbytes + sum(len(s.body) for s in self.steps)

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
snapshot a quarter window at a time (so it holds between ``size`` and 1.25 ``size`` steps),
and so are the oldest quarter of the totals held once they pass MAX_WINDOW_BYTES (a liar
whose lies fall out of the window that way is reported, as any older lie).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from daisychain.engine.trainer import Trainer, TrainState
from daisychain.peer.framing import Codec
from daisychain.peer.intcodec import decode_ints, encode_ints

#: the chance, at most, that a liar stays unremoved for longer than the window
ESCAPE = 1e-6
#: the longest window (steps), whatever the rate
MAX_WINDOW = 100_000
#: the most a window's totals hold (bytes): past it the oldest are folded into the snapshot
MAX_WINDOW_BYTES = 256 * 2**20


def log_escape(k: int, rate: float, strikes: int) -> float:
    """log P(fewer than ``strikes`` of ``k`` steps checked), each with probability ``rate``:
    the binomial terms C(k,i) r^i (1-r)^(k-i), i < strikes, summed in log space (no term
    underflows, whatever k). The same float operations as rollback.js logEscape."""
    lq, lr = math.log1p(-rate), math.log(rate)
    lt = k * lq
    terms = [lt]
    for i in range(min(strikes, k + 1) - 1):
        lt += math.log((k - i) / (i + 1)) + lr - lq
        terms.append(lt)
    top = max(terms)
    acc = 0.0
    for t in terms:
        acc += math.exp(t - top)
    return top + math.log(acc)


def window_steps(rate: float, strikes: int, escape: float = ESCAPE) -> int:
    """The smallest k with P(fewer than ``strikes`` of k steps checked) < ``escape``, each
    step checked with probability ``rate`` (0 when nothing is checked; at most MAX_WINDOW).
    P falls as k grows, so k is found by bisection, from a k at which P is still >= 1/2
    (while k * rate <= strikes - 1, the median of the checks is under ``strikes``): a few
    dozen sums of ``strikes`` terms, whatever a run announce says."""
    if not rate > 0.0:
        return 0
    if rate >= 1.0:
        return int(strikes)
    strikes = int(strikes)
    goal = math.log(escape)
    lo = max(strikes, math.floor((strikes - 1) / rate))
    if lo >= MAX_WINDOW or log_escape(MAX_WINDOW, rate, strikes) >= goal:
        return MAX_WINDOW
    if log_escape(lo, rate, strikes) < goal:
        return lo
    hi = MAX_WINDOW  # P(lo) >= escape > P(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if log_escape(mid, rate, strikes) < goal:
            hi = mid
        else:
            lo = mid
    return hi


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

    def __init__(self, size: int, bounds: list[int] | None = None, max_bytes: int = MAX_WINDOW_BYTES):
        self.size = int(size)
        self.bounds = bounds
        self.max_bytes = max_bytes
        self.held = 0  # bytes of the encoded totals
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
        self.held = 0

    def record(self, trainer: Trainer, step: int, total: np.ndarray, unchecked) -> None:
        """``total`` was applied at ``step`` (``trainer`` is now at step + 1). Past 1.25 times
        the window, the oldest quarter is folded into the snapshot (applied to it); past
        ``max_bytes`` of totals, the oldest quarter of those held."""
        if self.base is None:
            return
        codec, body = encode_ints(np.asarray(total, np.int64), self.bounds, (Codec.NARROW, Codec.VARINT))
        self.steps.append(_Step(step, codec, body, frozenset(unchecked)))
        self.held += len(body)
        chunk = max(1, self.size // 4)
        if self.held > self.max_bytes:
            chunk = max(1, len(self.steps) // 4)
        elif len(self.steps) < self.size + chunk:
            chunk = 0
        if chunk:
            old, self.steps = self.steps[:chunk], self.steps[chunk:]
            self.held -= sum(len(s.body) for s in old)
            now = trainer.snapshot()
            trainer.load(self.base)
            for s in old:
                trainer.apply(s.total(trainer.total_size))
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
            trainer.apply(s.total(trainer.total_size))
        self.steps = keep
        self.held = sum(len(s.body) for s in keep)

    def nbytes(self) -> int:
        """Memory the window holds: the snapshot and the totals."""
        if self.base is None:
            return 0
        b = self.base
        held = [b.theta, b.adam.m, b.adam.v] if hasattr(b, "adam") else [b.theta, b.outer, b.m, b.v]
        return sum(a.nbytes for a in held) + sum(len(s.body) for s in self.steps)

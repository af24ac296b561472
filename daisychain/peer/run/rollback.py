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


#: exact powers of two that move a scaled number's mantissa 32 binary places at a time
_BIG = 4294967296.0              # 2**32
_SMALL = 2.3283064365386963e-10  # 2**-32
#: terms of the escape sum more than this many binary places under the largest are left out
_DROP = 1000


def _scaled(m: float, e: int) -> tuple[float, int]:
    """(m, e) as the same number m * 2**e with 1/2 <= m < 1 (0 as (0.0, 0)): only products with
    powers of two, which are exact, so no value underflows or overflows however small."""
    if m == 0.0:
        return 0.0, 0
    while m >= _BIG:
        m = m * _SMALL
        e = e + 32
    while m < _SMALL:
        m = m * _BIG
        e = e - 32
    while m >= 1.0:
        m = m * 0.5
        e = e + 1
    while m < 0.5:
        m = m * 2.0
        e = e - 1
    return m, e


def _times(a: tuple[float, int], b: tuple[float, int]) -> tuple[float, int]:
    return _scaled(a[0] * b[0], a[1] + b[1])


def _power(x: float, n: int) -> tuple[float, int]:
    """x**n, scaled, by repeated squaring (the bits of n from the lowest)."""
    acc, base = (0.5, 1), _scaled(x, 0)
    while n > 0:
        if n % 2 == 1:
            acc = _times(acc, base)
        base = _times(base, base)
        n = n // 2
    return acc


def _half_power(d: int) -> float:
    """2**-d (0 <= d <= _DROP), exactly: a product of exact powers of two."""
    acc, base = 1.0, 0.5
    while d > 0:
        if d % 2 == 1:
            acc = acc * base
        base = base * base
        d = d // 2
    return acc


def escape_probability(k: int, rate: float, strikes: int) -> tuple[float, int]:
    """P(fewer than ``strikes`` of ``k`` steps checked), each with probability ``rate`` (0 < rate
    < 1), as a scaled number (m, e) = m * 2**e: the binomial terms C(k,i) r^i (1-r)^(k-i),
    i < strikes, each from the one before by a running product, summed from the largest's
    binary place. Only + - * / and comparisons (DETERMINISM.md rule 7), in this one order,
    the same as rollback.js escapeProbability: both languages get the same bits."""
    q = 1.0 - rate
    t = _power(q, k)
    terms = [t]
    for i in range(min(strikes, k + 1) - 1):
        m = t[0] * (k - i)
        m = m / (i + 1)
        m = m * rate
        m = m / q
        t = _scaled(m, t[1])
        terms.append(t)
    top = None
    for m, e in terms:
        if m != 0.0 and (top is None or e > top):
            top = e
    if top is None:
        return 0.0, 0
    acc = 0.0
    for m, e in terms:
        if m != 0.0 and top - e <= _DROP:
            acc = acc + m * _half_power(top - e)
    return _scaled(acc, top)


def _below(a: tuple[float, int], b: tuple[float, int]) -> bool:
    """a < b for scaled numbers (b not 0)."""
    return a[0] == 0.0 or a[1] < b[1] or (a[1] == b[1] and a[0] < b[0])


def window_steps(rate: float, strikes: int, escape: float = ESCAPE) -> int:
    """The smallest k with P(fewer than ``strikes`` of k steps checked) < ``escape``, each
    step checked with probability ``rate`` (0 when nothing is checked; at most MAX_WINDOW).
    P falls as k grows, so k is found by bisection, from a k at which P is still >= 1/2
    (while k * rate <= strikes - 1, the median of the checks is under ``strikes``): a few
    dozen sums of ``strikes`` terms, whatever a run announce says. P is
    :func:`escape_probability`: the definition, in Python and JS alike."""
    if not rate > 0.0:
        return 0
    if rate >= 1.0:
        return int(strikes)
    strikes = int(strikes)
    goal = _scaled(float(escape), 0)

    def under(k: int) -> bool:
        return _below(escape_probability(k, rate, strikes), goal)

    median = (strikes - 1) / rate  # inf for a subnormal rate: no window reaches it
    if median >= MAX_WINDOW or not under(MAX_WINDOW):
        return MAX_WINDOW
    lo = max(strikes, math.floor(median))
    if under(lo):
        return lo
    hi = MAX_WINDOW  # P(lo) >= escape > P(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if under(mid):
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
        #: params hash -> the liar: states a rollback undid (a restore to one is refused)
        self.tainted: dict[str, str] = {}

    @property
    def first(self) -> int | None:
        """The earliest step the window can go back to."""
        return None if self.base is None else self.base.step

    def reset(self, trainer: Trainer) -> None:
        """Start the window at the replica's current state (a new term, a restore)."""
        self.base = trainer.snapshot() if self.size else None
        self.steps = []
        self.held = 0

    def record(self, trainer: Trainer, step: int, total: np.ndarray, unchecked,
               encoded: tuple[int, bytes] | None = None) -> None:
        """``total`` was applied at ``step`` (``trainer`` is now at step + 1); ``encoded``: the
        same total as the wire sends it (:meth:`encode`), if the caller has it. Past 1.25 times
        the window, the oldest quarter is folded into the snapshot (applied to it); past
        ``max_bytes`` of totals, the oldest quarter of those held."""
        if self.base is None:
            return
        codec, body = encoded or self.encode(total)
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

    def rebase(self, trainer: Trainer) -> bool:
        """The replica just loaded a whole state (a restore, a sync, a catch-up): keep the
        steps before it when the window leads to that same state (its parameters at that
        step), so that a lie from before a restore can still be rolled back; else start the
        window again at the loaded state. True when the steps were kept."""
        at, now = trainer.state.step, trainer.snapshot()
        sha = trainer.params_sha256()
        ok = False
        if self.base is not None and self.base.step <= at and \
                at <= (self.steps[-1].step + 1 if self.steps else self.base.step):
            trainer.load(self.base)
            for s in self.steps:
                if s.step < at:
                    trainer.apply(s.total(trainer.total_size))
            ok = trainer.state.step == at and trainer.params_sha256() == sha
            trainer.load(now)
        if not ok:
            self.reset(trainer)
            return False
        self.steps = [s for s in self.steps if s.step < at]
        self.held = sum(len(s.body) for s in self.steps)
        return True

    def unchecked_since(self) -> dict[str, int]:
        """peer -> the first step in the window with an unchecked contribution of it."""
        out: dict[str, int] = {}
        for s in self.steps:
            for p in sorted(s.unchecked):
                out.setdefault(p, s.step)
        return out

    def encode(self, total: np.ndarray) -> tuple[int, bytes]:
        """A total as the window holds it and the wire sends it (NARROW or VARINT, the smaller)."""
        return encode_ints(np.asarray(total, np.int64), self.bounds, (Codec.NARROW, Codec.VARINT))

    def earliest(self, peer: str) -> int | None:
        """The first step in the window with an unchecked contribution of ``peer``."""
        return next((s.step for s in self.steps if peer in s.unchecked), None)

    def go_back(self, trainer: Trainer, step: int, liar: str = "") -> None:
        """Load the state the run had at ``step`` (within the window) into ``trainer``, and
        forget the steps from there on; the states after them are remembered as ``liar``'s
        (:attr:`tainted`: a checkpoint saved before the liar was caught holds its lies)."""
        trainer.load(self.base)
        keep = [s for s in self.steps if s.step < step]
        for s in keep:
            trainer.apply(s.total(trainer.total_size))
        back = trainer.snapshot()
        for s in self.steps[len(keep):]:
            trainer.apply(s.total(trainer.total_size))
            self.tainted[trainer.params_sha256()] = liar
        trainer.load(back)
        self.steps = keep
        self.held = sum(len(s.body) for s in keep)

    def nbytes(self) -> int:
        """Memory the window holds: the snapshot and the totals."""
        if self.base is None:
            return 0
        b = self.base
        held = [b.theta, b.adam.m, b.adam.v] if hasattr(b, "adam") else [b.theta, b.outer, b.m, b.v]
        return sum(a.nbytes for a in held) + sum(len(s.body) for s in self.steps)

"""Exact local steps (DiLoCo): R replicas each take H inner Adam steps from the global
parameters, then one outer Nesterov step on their averaged parameter deltas, summed as
fixed-point integers, so the result is the same bits for any device mix.

:class:`LocalTrainer` wraps :class:`~daisychain.engine.trainer.Trainer` and offers the seam
the run protocol uses: a run *step* is a *round*, and the *tasks* of a step (what
``Trainer`` calls micro-batches) are the *replicas*. ``contribute(replica_ids, round, theta)``
returns one int64 vector, ``apply(total)`` takes the sum of every replica's vector.

Round n, replica j (0 <= j < R), inner step h (0 <= h < H) trains on the synchronous
schedule's step ``s = (n*H + h)*R + j`` (all of its micro-batches, summed exactly as a
synchronous step, then ``adam_step`` with the replica's own moments m_j, v_j; the Adam step
counter and the bias products are the same for every replica and are kept once).

After H inner steps, with theta_g the round's global parameters and theta_j the replica's::

    delta_j = theta_g - theta_j                                  # one IEEE op
    q_j = clamp(floor(delta_j * 2**D + 0.5), -L, L)  (int64)     # D = DELTA_FRAC_BITS, L = floor(2**51 / R)

The contribution of a task is ``[q_j (P) | replica 0 | ... | replica R-1]``, each replica's
block ``[m lo, m hi, v lo, v hi]`` (P entries each: the low and high unsigned 32-bit halves of
the float64 bits), zero except in the blocks of the replicas the task computed. The total
(an exact integer sum in any order) carries Q = sum_j q_j and every replica's new moments.
``apply(total)``, per element, in this order (every operation one IEEE float64 op)::

    d = Q * 2**-(D + log2 R)          # R a power of two: one exact scaling
    d = (Q * 2**-D) / R               # otherwise
    buf = mu * buf + d
    theta_g = theta_g - lr_o * (d + mu * buf)

(mu = outer_momentum, lr_o = outer_lr; plain averaging is lr_o = 1, mu = 0.)

Anchors: the moment blocks travel only in an *anchor* round, round n with (n + 1) % K == 0
(K = ``hp.moments_every``, ``--moments-every``, default 8, in the identity JSON only when not
the default); its total installs every replica's moments on every device.
Between anchors a contribution's moment blocks are zero (6 bytes a block on the wire,
peer/intcodec.py) and so are the total's. Every device holds theta_g, the outer buffer, the
moments of the last anchor (the start of round a = n - n % K) and theta_g at the start of
every round since (``hist``, at most K - 1 vectors). A device that computed replica j in
round n keeps j's moments after it, privately, keyed by n and the SHA-256 of theta_g at
round n's start (and dropped on every ``load``); without them, ``contribute`` replays j from
the anchor through ``hist`` (at most K - 1 extra rounds of one replica). Moments are exact
either way, so the parameters' bits do not depend on K or on who computed what.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from daisychain.engine.adam import AdamState, adam_step
from daisychain.engine.data import Dataset
from daisychain.engine.detmath import pow2
from daisychain.engine.model import Result
from daisychain.engine.spec import MOMENTS_EVERY, Hyper, ModelSpec  # noqa: F401  (re-exported)
from daisychain.engine.trainer import Trainer, params_sha256
from daisychain.units.luts import LutSet

#: D: a parameter delta crosses the wire as floor(delta * 2**D + 1/2); 2**-32 (2.3e-10) is
#: far below an Adam step's size, and |delta| up to 2**51 / R / 2**32 (512 at R = 1024)
#: passes unclamped
DELTA_FRAC_BITS = 32
_LO = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


class StaleRound(ValueError):
    """A round this trainer cannot compute now: before its anchor (the room moved past it
    while the compute waited) or after its current round. The shell drops the compute."""


def delta_limit(replicas: int) -> float:
    """L = floor(2**51 / R): a sum of R deltas stays below 2**51, exact in int64 and JS."""
    return float((2**51) // replicas)


@dataclass
class LocalState:
    """A local-steps run's whole state at a round boundary."""

    theta: np.ndarray  #: (P,) the global parameters theta_g
    outer: np.ndarray  #: (P,) the outer Nesterov buffer
    m: np.ndarray  #: (R, P) every replica's inner Adam first moments at the last anchor
    v: np.ndarray  #: (R, P) and second moments
    step: int = 0  #: rounds done
    inner: int = 0  #: inner Adam steps each replica has taken (step * H)
    b1t: float = 1.0  #: beta1 ** inner, as the running product adam_step keeps
    b2t: float = 1.0
    #: (step % K, P): theta_g at the start of each round since the anchor (rounds a..step-1)
    hist: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    def copy(self) -> "LocalState":
        return LocalState(self.theta.copy(), self.outer.copy(), self.m.copy(), self.v.copy(),
                          int(self.step), int(self.inner), float(self.b1t), float(self.b2t),
                          self.hist.copy())


def theta_key(theta: np.ndarray) -> bytes:
    """The SHA-256 of a parameter vector's float64 bytes (keys a device's private moments)."""
    return hashlib.sha256(np.ascontiguousarray(theta, "<f8").tobytes()).digest()


def bias_products(beta1: float, beta2: float, n: int) -> tuple[float, float]:
    """beta1 ** n and beta2 ** n as adam_step's running products make them (n products)."""
    b1t = b2t = 1.0
    for _ in range(n):
        b1t, b2t = b1t * beta1, b2t * beta2
    return b1t, b2t


def pack_moments(m: np.ndarray, v: np.ndarray) -> np.ndarray:
    """[m lo, m hi, v lo, v hi]: the two unsigned 32-bit halves of each float64, as int64."""
    out = []
    for a in (m, v):
        bits = np.ascontiguousarray(a, "<f8").view("<u8")
        out += [(bits & _LO).astype(np.int64), (bits >> _SHIFT).astype(np.int64)]
    return np.concatenate(out)


def unpack_moments(block: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`pack_moments`; ValueError when a half is not an unsigned 32-bit
    integer or a moment is not finite (a total that no replica made)."""
    block = np.asarray(block, np.int64)
    if block.size != 4 * size or (block.size and (block.min() < 0 or block.max() > 0xFFFFFFFF)):
        raise ValueError("the total's moment block is not unsigned 32-bit halves")
    halves = block.astype(np.uint64).reshape(4, size)
    m = ((halves[1] << _SHIFT) | halves[0]).view(np.float64)
    v = ((halves[3] << _SHIFT) | halves[2]).view(np.float64)
    if not (np.isfinite(m).all() and np.isfinite(v).all()) or (v < 0).any():
        raise ValueError("the total's moments are not finite")
    return m.copy(), v.copy()


class LocalTrainer:
    """A local-steps run (``hp.replicas`` R, ``hp.sync_every`` H) behind the Trainer seam."""

    def __init__(self, spec: ModelSpec, hp: Hyper, ds: Dataset, luts: LutSet, gemm: str = "fast",
                 threads: int = 1):
        self.base = Trainer(spec, hp, ds, luts, gemm, threads)
        self.spec, self.hp, self.ds, self.luts = spec, hp, ds, luts
        self.engine, self.layout, self.schedule = self.base.engine, self.base.layout, self.base.schedule
        self.identity, self.run_id = self.base.identity, self.base.run_id
        self.replicas, self.sync_every = hp.replicas, hp.sync_every
        self.moments_every = hp.moments_every  #: K, --moments-every
        p, r = self.layout.size, hp.replicas
        self.n_tasks = r  #: tasks of a step (a round): one per replica
        self.total_size = p * (1 + 4 * r)  #: entries of a contribution and of a total
        self.limit = delta_limit(r)
        self.state = LocalState(self.base.state.theta, np.zeros(p), np.zeros((r, p)), np.zeros((r, p)),
                                hist=np.zeros((0, p)))
        #: replica -> (round n, theta_key of theta_g at n's start, m, v after round n): this
        #: device's own moments, never sent between anchors
        self.own: dict[int, tuple] = {}
        self.replayed = 0  #: replica rounds recomputed from the anchor (a moved replica, a check)

    @property
    def theta(self) -> np.ndarray:
        return self.state.theta

    @property
    def anchor_round(self) -> int:
        """The round whose start holds the last anchor's moments (a multiple of K)."""
        return self.state.step - self.state.step % self.moments_every

    def is_anchor(self, rnd: int) -> bool:
        """Whether round ``rnd``'s contributions and total carry the moments."""
        return (int(rnd) + 1) % self.moments_every == 0

    def steps_of(self, rnd: int, replica: int) -> list[int]:
        """The synchronous schedule's steps replica ``replica`` trains on in round ``rnd``."""
        h, r = self.sync_every, self.replicas
        return [(rnd * h + i) * r + replica for i in range(h)]

    def _round(self, j: int, rnd: int, theta: np.ndarray, adam: AdamState, split, seen, correct):
        """Replica j's H inner steps of round ``rnd`` from ``theta`` (``adam`` advances)."""
        p = self.layout.size
        gscale, gdiv = self.base.grad_scaling()
        th = theta.copy()
        for s in self.steps_of(rnd, j):
            parts = split(s) if split is not None else [list(range(self.hp.n_micro))]
            total = np.zeros(p, np.int64)
            for part in parts:
                res = self.base.contribute(part, s, th)
                total += res.grad
                seen.append(res.loss)
                correct[0] += int(np.sum(res.correct))
            adam_step(th, adam, total, self.hp, gscale, gdiv)
        return th

    def _start(self, st: LocalState, j: int, rnd: int, split) -> AdamState:
        """Replica j's inner Adam state at round ``rnd``'s start: its private moments after
        round rnd - 1 when they follow the held history, else replayed from the anchor."""
        a = st.step - st.step % self.moments_every
        if not a <= rnd <= st.step or len(st.hist) != st.step - a:
            raise StaleRound(f"round {rnd} is not between this trainer's anchor {a} and round {st.step}")
        if rnd > a:
            mine = self.own.get(j)
            if mine is not None and mine[0] == rnd - 1 and mine[1] == theta_key(st.hist[rnd - 1 - a]):
                b1t, b2t = ((st.b1t, st.b2t) if rnd == st.step else
                            bias_products(self.hp.beta1, self.hp.beta2, rnd * self.sync_every))
                return AdamState(mine[2].copy(), mine[3].copy(), rnd * self.sync_every, b1t, b2t)
        b1t, b2t = ((st.b1t, st.b2t) if st.step == a else  # st's are round st.step's (a late
                    bias_products(self.hp.beta1, self.hp.beta2, a * self.sync_every))  # compute)
        adam = AdamState(st.m[j].copy(), st.v[j].copy(), a * self.sync_every, b1t, b2t)
        for n in range(a, rnd):
            self._round(j, n, st.hist[n - a], adam, split, [], [0])
            self.replayed += 1
        return adam

    def contribute(self, micro_ids, step: int | None = None, theta: np.ndarray | None = None,
                   split=None) -> Result:
        """The contribution of the replicas ``micro_ids`` to round ``step`` (default: the
        current one; any round since the anchor), starting from ``theta`` (default: theta_g;
        a copy lets a compute thread never see it change). A replica's moments at the
        round's start are this device's own when it computed the previous round from the
        held history, else replayed from the anchor. ``split(s)``: how step s's
        micro-batches are shared by simulated workers (default: one share)."""
        st = self.state  # apply and load install a new state object: one consistent view
        step = st.step if step is None else int(step)
        theta = st.theta if theta is None else np.asarray(theta, np.float64)
        ids = [int(j) for j in micro_ids]
        p = self.layout.size
        out = np.zeros(self.total_size, np.int64)
        losses, correct = np.zeros(len(ids)), np.zeros(len(ids), np.int64)
        key = theta_key(theta)
        for i, j in enumerate(ids):
            if not 0 <= j < self.replicas:
                raise ValueError(f"replica {j} is not one of this run's {self.replicas}")
            adam = self._start(st, j, step, split)
            seen, got = [], [0]
            th = self._round(j, step, theta, adam, split, seen, got)
            correct[i] = got[0]
            self.own[j] = (step, key, adam.m.copy(), adam.v.copy())
            delta = theta - th
            q = np.floor(delta * pow2(DELTA_FRAC_BITS) + 0.5)
            out[:p] += np.clip(q, -self.limit, self.limit).astype(np.int64)
            if self.is_anchor(step):
                at = p + 4 * p * j
                out[at:at + 4 * p] = pack_moments(adam.m, adam.v)
            losses[i] = float(np.mean(np.concatenate(seen))) if seen else 0.0
        return Result(out, losses, correct)

    def contribution_error(self, ints: np.ndarray, micro, step: int | None = None) -> str | None:
        """Why a received contribution to replicas ``micro`` of round ``step`` (default: the
        current one) cannot be one (None: it can): a moment block that is not zero in a
        round between anchors or of a replica it was not given, or in its own blocks of an
        anchor round halves that are not unsigned 32-bit integers or moments that are not
        finite (a total holding them would stop every replica's apply). Its values are the
        spot-checks' business."""
        p, r = self.layout.size, self.replicas
        ints = np.asarray(ints, np.int64).reshape(-1)
        if ints.size != self.total_size:
            return f"not {self.total_size} integers"
        anchor = self.is_anchor(self.state.step if step is None else step)
        mine = {int(j) for j in micro} if anchor else set()
        blocks = ints[p:].reshape(r, 4 * p)
        for j in range(r):
            if j not in mine:
                if blocks[j].any():
                    return (f"moments of replica {j}, which it was not given" if anchor else
                            f"moments of replica {j} in a round between anchors")
                continue
            try:
                unpack_moments(blocks[j], p)
            except ValueError as exc:
                return f"replica {j}: {exc}"
        return None

    def outer_scaling(self) -> tuple[float, float]:
        """(scale, div) with d = Q * scale / div: one exact scaling when R is a power of two."""
        r, d = self.replicas, DELTA_FRAC_BITS
        if r & (r - 1) == 0:
            return float(pow2(-d - (r.bit_length() - 1))), 1.0
        return float(pow2(-d)), float(r)

    def apply(self, total: np.ndarray) -> None:
        """The outer step from a round's total; an anchor round's total installs every
        replica's new inner moments, another's (moment blocks all zero) adds theta_g at the
        round's start to the history."""
        total = np.asarray(total, np.int64).reshape(-1)
        p, r, hp = self.layout.size, self.replicas, self.hp
        if total.size != self.total_size:
            raise ValueError(f"a total of {total.size} entries, the run's are {self.total_size}")
        st = self.state
        anchor = self.is_anchor(st.step)
        m, v = np.empty((r, p)), np.empty((r, p))
        if anchor:
            for j in range(r):
                at = p + 4 * p * j
                m[j], v[j] = unpack_moments(total[at:at + 4 * p], p)
        elif total[p:].any():
            raise ValueError("the total carries moments in a round between anchors")
        before = st.theta.copy()
        scale, div = self.outer_scaling()
        d = np.multiply(total[:p], scale, dtype=np.float64)
        if div != 1.0:
            d = np.divide(d, div, out=d)
        mu, lr = hp.outer_momentum, hp.outer_lr
        buf = np.add(np.multiply(st.outer, mu), d)  # buf = mu * buf + d
        step = np.multiply(lr, np.add(d, np.multiply(mu, buf)))  # lr_o * (d + mu * buf)
        b1t, b2t = st.b1t, st.b2t
        for _ in range(self.sync_every):
            b1t, b2t = b1t * hp.beta1, b2t * hp.beta2
        hist = np.zeros((0, p)) if anchor else np.concatenate([st.hist, before[None]])
        st.theta -= step  # in place: theta_g is the array the caller may hold
        # one new state object (a contribute in flight keeps its consistent view)
        self.state = LocalState(st.theta, buf, m if anchor else st.m, v if anchor else st.v,
                                st.step + 1, st.inner + self.sync_every, b1t, b2t, hist)

    def snapshot(self) -> LocalState:
        return self.state.copy()

    @property
    def state_sizes(self) -> tuple[int, int]:
        """On the wire (STATE): "theta" is [theta_g | outer buffer | hist, K - 1 rows, the
        unused ones zero], each moment part every replica's at the anchor, replica after
        replica. The private moments never travel."""
        p = self.layout.size
        return (1 + self.moments_every) * p, self.replicas * p

    def wire_state(self) -> tuple:
        st = self.snapshot()
        p = self.layout.size
        hist = np.zeros((self.moments_every - 1) * p)
        hist[:st.hist.size] = st.hist.reshape(-1)
        return (st.step, np.concatenate([st.theta, st.outer, hist]), st.m.reshape(-1),
                st.v.reshape(-1), st.b1t, st.b2t)

    def state_of(self, step: int, theta, m, v, b1t: float, b2t: float) -> LocalState:
        p, r = self.layout.size, self.replicas
        theta = np.asarray(theta, np.float64)
        n = int(step) % self.moments_every
        return LocalState(theta[:p].copy(), theta[p:2 * p].copy(), np.asarray(m, np.float64).reshape(r, p),
                          np.asarray(v, np.float64).reshape(r, p), int(step), int(step) * self.sync_every,
                          float(b1t), float(b2t), theta[2 * p:(2 + n) * p].reshape(n, p).copy())

    def load(self, state: LocalState) -> None:
        """Replace the state with a copy of ``state`` (theta_g is written in place); this
        device's private moments are dropped (they may follow another history)."""
        p, r = self.layout.size, self.replicas
        src = state.copy()
        if src.theta.shape != (p,) or src.outer.shape != (p,) or src.m.shape != (r, p) \
                or src.v.shape != (r, p):
            raise ValueError(f"a local state of another shape than this run's ({r} replicas "
                             f"of {p} parameters)")
        if src.inner != src.step * self.sync_every:
            raise ValueError(f"a local state at round {src.step} with {src.inner} inner steps, "
                             f"not {src.step * self.sync_every}")
        n = src.step % self.moments_every
        if src.hist.size == 0:
            src.hist = np.zeros((0, p))
        if src.hist.shape != (n, p):
            raise ValueError(f"a local state at round {src.step} needs theta_g of the {n} "
                             f"round(s) since its anchor, it holds {src.hist.shape[0]}")
        theta = self.state.theta
        theta[:] = src.theta
        src.theta = theta  # theta_g stays the array the caller may hold
        self.state, self.own = src, {}

    def accuracy(self, split: str = "test") -> float:
        return self.base.accuracy(split)

    def mse(self, split: str = "test") -> float | None:
        return self.base.mse(split)

    def test_loss(self, split: str = "test") -> float:
        return self.base.test_loss(split)

    def params_sha256(self) -> str:
        return params_sha256(self.state.theta)


def make_trainer(spec: ModelSpec, hp: Hyper, ds: Dataset, luts: LutSet, gemm: str = "fast",
                 threads: int = 1):
    """The run's trainer: a LocalTrainer for a local-steps run, else the synchronous Trainer;
    ``threads``: a step's micro-batches on that many threads (engine/threads.py; a local run's
    replicas still run one after another)."""
    return (LocalTrainer if hp.local else Trainer)(spec, hp, ds, luts, gemm, threads)

"""The one state loader: a replica takes a whole state (a member's sync or late join, the
coordinator catching up with a member ahead, a restore, a rollback) only through
:func:`load_state`, after :func:`checked_state` made sure it fits the run."""

from __future__ import annotations

import numpy as np

from daisychain.engine.trainer import Trainer, TrainState, params_sha256
from daisychain.peer import frames as F
from daisychain.peer.run.outputs import RestoreError


def tensor_bounds(trainer: Trainer) -> list[int]:
    """Segment bounds of a contribution: one segment per canonical tensor (a local-steps
    run's, engine/local.py: then one per block of P moment halves)."""
    p = trainer.layout.size
    out = [0] + [int(o + np.prod(s)) for o, s in zip(trainer.layout.offsets, trainer.layout.shapes)]
    return out + list(range(2 * p, trainer.total_size + 1, p))


def state_message(trainer: Trainer) -> F.State:
    """This replica's whole state as a STATE message."""
    step, theta, m, v, b1t, b2t = trainer.wire_state()
    return F.State(step, params_sha256(theta[:trainer.layout.size]), theta, m, v, b1t, b2t)


def checked_state(trainer: Trainer, step: int, theta, m, v, b1t: float, b2t: float,
                  sha: str | None = None) -> TrainState:
    """A state for ``trainer``'s run (its wire form, ``trainer.state_sizes``); RestoreError
    when it has the wrong size, a non-finite value or parameters that do not hash to ``sha``."""
    n, k = trainer.state_sizes
    theta, m, v = (np.array(a, np.float64) for a in (theta, m, v))
    if theta.shape != (n,) or m.shape != (k,) or v.shape != (k,):
        raise RestoreError(f"the state holds {theta.size} parameters, the run's model {n}")
    if not (np.isfinite(theta).all() and np.isfinite(m).all() and np.isfinite(v).all()):
        raise RestoreError("the state holds non-finite values")
    got = params_sha256(theta[:trainer.layout.size]) if sha is not None else None
    if sha is not None and sha != got:
        raise RestoreError(f"the state's parameters hash to {got}, not {sha}")
    return trainer.state_of(step, theta, m, v, b1t, b2t)


def load_state(trainer: Trainer, state: TrainState) -> None:
    trainer.load(state)

"""The one state loader: a replica takes a whole state (a member's sync or late join, the
coordinator catching up with a member ahead, a restore, a rollback) only through
:func:`load_state`, after :func:`checked_state` made sure it fits the run."""

from __future__ import annotations

import numpy as np

from daisychain.engine.adam import AdamState
from daisychain.engine.trainer import Trainer, TrainState, params_sha256
from daisychain.peer import frames as F
from daisychain.peer.run.outputs import RestoreError


def tensor_bounds(trainer: Trainer) -> list[int]:
    """Segment bounds of the flat vector: one segment per canonical tensor."""
    return [0] + [int(o + np.prod(s)) for o, s in zip(trainer.layout.offsets, trainer.layout.shapes)]


def state_message(trainer: Trainer) -> F.State:
    """This replica's whole state as a STATE message."""
    st = trainer.snapshot()
    return F.State(st.step, params_sha256(st.theta), st.theta, st.adam.m, st.adam.v,
                   st.adam.b1t, st.adam.b2t)


def checked_state(trainer: Trainer, step: int, theta, m, v, b1t: float, b2t: float,
                  sha: str | None = None) -> TrainState:
    """A state for ``trainer``'s run; RestoreError when it has the wrong size, a non-finite
    value or parameters that do not hash to ``sha``."""
    n = trainer.layout.size
    theta, m, v = (np.array(a, np.float64) for a in (theta, m, v))
    if theta.shape != (n,) or m.shape != (n,) or v.shape != (n,):
        raise RestoreError(f"the state holds {theta.size} parameters, the run's model {n}")
    if not (np.isfinite(theta).all() and np.isfinite(m).all() and np.isfinite(v).all()):
        raise RestoreError("the state holds non-finite values")
    got = params_sha256(theta) if sha is not None else None
    if sha is not None and sha != got:
        raise RestoreError(f"the state's parameters hash to {got}, not {sha}")
    return TrainState(theta, AdamState(m, v, int(step), float(b1t), float(b2t)), int(step))


def load_state(trainer: Trainer, state: TrainState) -> None:
    trainer.load(state)

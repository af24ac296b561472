"""Deterministic Adam over the flat float64 parameter vector.

Per element, in exactly this order (every operation one IEEE float64 op; no fused
multiply-add, no pow: the bias corrections are running products)::

    b1t = b1t * beta1                  # scalars, once per step
    b2t = b2t * beta2
    m = beta1 * m + (1 - beta1) * g    # (1 - beta1) is one scalar subtraction
    v = beta2 * v + (1 - beta2) * (g * g)
    mhat = m / (1 - b1t)
    vhat = v / (1 - b2t)
    u = mhat / (sqrt(vhat) + eps)
    p = p - lr * u                               # weight_decay == 0
    p = p - (lr * u + (lr * weight_decay) * p)   # weight_decay > 0 (decoupled, AdamW)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daisychain.engine.spec import Hyper


@dataclass
class AdamState:
    m: np.ndarray
    v: np.ndarray
    step: int = 0
    b1t: float = 1.0
    b2t: float = 1.0

    @staticmethod
    def zeros(size: int) -> "AdamState":
        return AdamState(np.zeros(size), np.zeros(size))


def adam_step(theta: np.ndarray, state: AdamState, g: np.ndarray, hp: Hyper) -> None:
    """Update theta and state in place."""
    b1, b2 = hp.beta1, hp.beta2
    state.step += 1
    state.b1t = state.b1t * b1
    state.b2t = state.b2t * b2
    state.m = b1 * state.m + (1.0 - b1) * g
    state.v = b2 * state.v + (1.0 - b2) * (g * g)
    mhat = state.m / (1.0 - state.b1t)
    vhat = state.v / (1.0 - state.b2t)
    u = mhat / (np.sqrt(vhat) + hp.eps)
    if hp.weight_decay:
        theta[:] = theta - (hp.lr * u + (hp.lr * hp.weight_decay) * theta)
    else:
        theta[:] = theta - hp.lr * u

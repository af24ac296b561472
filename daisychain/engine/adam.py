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

from dataclasses import dataclass, field

import numpy as np

from daisychain.engine.spec import Hyper


@dataclass
class AdamState:
    """``m`` and ``v`` are updated in place by :func:`adam_step`, like theta. An array
    assigned from outside (a restored or received state) is copied on the next step, so
    the caller's array is never written."""

    m: np.ndarray
    v: np.ndarray
    step: int = 0
    b1t: float = 1.0
    b2t: float = 1.0
    _own: dict = field(default_factory=dict, repr=False, compare=False)

    @staticmethod
    def zeros(size: int) -> "AdamState":
        return AdamState(np.zeros(size), np.zeros(size))

    def _owned(self, name: str) -> np.ndarray:
        arr = getattr(self, name)
        if self._own.get(name) is not arr:
            arr = np.array(arr, np.float64)  # a private, writable, contiguous copy
            setattr(self, name, arr)
            self._own[name] = arr
        return arr

    def _scratch(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        s = self._own.get("scratch")
        if s is None or s[0].size != size:
            s = (np.empty(size), np.empty(size))
            self._own["scratch"] = s
        return s


def adam_step(theta: np.ndarray, state: AdamState, g: np.ndarray, hp: Hyper) -> None:
    """Update theta and state in place: the expressions above, each one IEEE float64
    operation per element, written into preallocated arrays (no temporaries: large
    allocations cost more than the arithmetic here)."""
    b1, b2 = hp.beta1, hp.beta2
    state.step += 1
    state.b1t = state.b1t * b1
    state.b2t = state.b2t * b2
    m, v = state._owned("m"), state._owned("v")
    t1, t2 = state._scratch(m.size)
    np.multiply(m, b1, out=m)  # m = beta1 * m + (1 - beta1) * g
    np.multiply(g, 1.0 - b1, out=t1)
    m += t1
    np.multiply(g, g, out=t1)  # v = beta2 * v + (1 - beta2) * (g * g)
    t1 *= 1.0 - b2
    np.multiply(v, b2, out=v)
    v += t1
    np.divide(m, 1.0 - state.b1t, out=t2)  # mhat
    np.divide(v, 1.0 - state.b2t, out=t1)  # vhat
    np.sqrt(t1, out=t1)
    t1 += hp.eps
    np.divide(t2, t1, out=t2)  # u = mhat / (sqrt(vhat) + eps)
    t2 *= hp.lr  # lr * u
    if hp.weight_decay:
        np.multiply(theta, hp.lr * hp.weight_decay, out=t1)
        t2 += t1  # lr * u + (lr * weight_decay) * p
    theta -= t2

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

``lr`` is the schedule's rate for this update (``augment.lr_at(hp, t)``, t = the number of
updates before this one): ``hp.lr`` itself unless ``lr_warmup`` / ``lr_decay_steps`` are set.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from daisychain.compiled import numba_jit
from daisychain.engine.augment import lr_at
from daisychain.engine.spec import Hyper

#: parameter vectors at least this long take the compiled single pass (numba), shorter ones
#: too once numba is imported (by the engine's compiled path, daisychain/engine/fast.py).
#: Otherwise the numpy passes run: for short vectors they cost under ~100 us a step, less
#: than importing numba (~0.35 s of CPU, once per process) would save in most runs. Both
#: paths give the same bits.
FUSED_MIN_SIZE = 16384


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


def _adam_loop(theta, m, v, src, gscale, gdiv, b1, b2, c1, c2, c1t, c2t, eps, lr, wd, lrwd):
    """One pass over the elements, each the module docstring's expressions in its order,
    every operation one IEEE float64 operation: g = src * gscale (exact: a power of two
    times an integer below 2**53, or g itself when gscale == 1), then g = g / gdiv when
    gdiv != 1; the decay term only when ``wd`` (weight_decay != 0). Compiled without fastmath, LLVM neither fuses a multiply and an add nor
    reorders anything (no reduction here), so the bits are numpy's; error_model="numpy"
    (IEEE division, no Python ZeroDivisionError check) is what lets it vectorize."""
    for i in range(theta.shape[0]):
        g = src[i] * gscale
        if gdiv != 1.0:
            g = g / gdiv
        mi = b1 * m[i] + c1 * g
        vi = b2 * v[i] + c2 * (g * g)
        m[i] = mi
        v[i] = vi
        u = (mi / c1t) / (np.sqrt(vi / c2t) + eps)
        p = theta[i]
        if wd:
            theta[i] = p - (lr * u + lrwd * p)
        else:
            theta[i] = p - lr * u


_fused = None


def _fused_kernel():
    """The compiled loop (numba, imported and compiled or loaded from its cache on first
    use; None without numba or with DAISYCHAIN_NO_NUMBA set)."""
    global _fused
    if _fused is None:
        jit = numba_jit()
        if jit is None:
            return None
        _fused = jit(_adam_loop)
    return _fused


def adam_step(theta: np.ndarray, state: AdamState, g: np.ndarray, hp: Hyper,
              gscale: float = 1.0, gdiv: float = 1.0) -> None:
    """Update theta and state in place: the expressions above, each one IEEE float64
    operation per element. ``g`` is the gradient, or an int64 total with ``gscale`` (a
    power of two) and ``gdiv`` to make it: g = total * gscale / gdiv (see
    Trainer.mean_grad). With numba this is one compiled pass over the elements; without
    it (or for arrays it does not take), numpy passes into preallocated arrays."""
    b1, b2 = hp.beta1, hp.beta2
    lr = lr_at(hp, state.step)
    state.step += 1
    state.b1t = state.b1t * b1
    state.b2t = state.b2t * b2
    m, v = state._owned("m"), state._owned("v")
    kern = _fused_kernel() if theta.size >= FUSED_MIN_SIZE or "numba" in sys.modules else None
    if (kern is not None and theta.dtype == np.float64 and theta.ndim == 1
            and theta.flags.c_contiguous and theta.flags.writeable
            and g.ndim == 1 and g.size == theta.size and g.dtype in (np.float64, np.int64)):
        src = np.ascontiguousarray(g)
        if not src.flags.writeable:  # e.g. a decoded total: numba would compile another
            src = src.copy()         # specialization for a read-only array (seconds, once)
        kern(theta, m, v, src, float(gscale), float(gdiv), b1, b2,
             1.0 - b1, 1.0 - b2, 1.0 - state.b1t, 1.0 - state.b2t, hp.eps, lr,
             bool(hp.weight_decay), lr * hp.weight_decay)
        return
    if gscale != 1.0 or gdiv != 1.0 or g.dtype != np.float64:
        g = np.multiply(g, gscale, dtype=np.float64)
        if gdiv != 1.0:
            g /= gdiv
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
    t2 *= lr  # lr * u
    if hp.weight_decay:
        np.multiply(theta, lr * hp.weight_decay, out=t1)
        t2 += t1  # lr * u + (lr * weight_decay) * p
    theta -= t2

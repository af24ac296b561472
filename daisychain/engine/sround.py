"""Stochastic rounding of a sequence model's output error (docs/ENGINE.md, "Loss (sequence
models)"; issue 37).

A transformer's output error ``dz`` (rows b*T, classes C) has one int8 scale per micro-batch:
most small probabilities lie below half a unit, and ``floor(v + 1/2)`` rounds them to 0 on
every step. That bias cost ~0.08 nats against the float twin (docs/BENCHMARKS.md, "Why the
engine lags its float twin"). Here ``u`` in [0, 1) comes from an integer hash of the sample
and the entry (DETERMINISM.md rule 10: ``engine/prng.py``'s ``mix32`` only, arithmetic mod
2**32), so every replica draws the same ``u`` for an entry whichever peer, thread or split
computes it::

    h = 0; for v in (x[s, 0], ..., x[s, T-1], y[s]):  h = mix32(((h + 0x9E3779B9) mod 2**32) ^ v)
    r(s, t)    = mix32(h ^ (t * 0x85EBCA6B mod 2**32))          # row t of sample s
    u(s, t, c) = mix32((r(s, t) + c * 0x9E3779B9) mod 2**32) * 2**-32
    q = clamp(floor(dz * 2**-eg + u), -127, 127)                # then zero-sum per row

The key is the sample's tokens (its window and label), not its place in the schedule: the
engine's gradient call sees only the micro-batch, and the same tokens give the same key in
every split. A window met again in a later epoch draws the same ``u``. The JS twin is
``webui/engine/sround.js``; ``tests/engine/test_sround.py`` holds them to the same bytes.
"""

from __future__ import annotations

import numpy as np

from daisychain.engine.detmath import pow2, quant_exponent
from daisychain.engine.prng import M32, mix32

GOLDEN = 0x9E3779B9
ROW = 0x85EBCA6B
TWO_M32 = 2.3283064365386963e-10  # 2**-32, exact


def _mul32(i: np.ndarray, k: int) -> np.ndarray:
    """(i * k) mod 2**32 for integers i >= 0, as uint32 (exact: uint64 products below 2**64)."""
    return ((np.asarray(i, np.uint64) * np.uint64(k)) & np.uint64(M32)).astype(np.uint32)


def sample_keys(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """h per sample: x (..., T) token ids, y (...) labels -> uint32 (...)."""
    x = np.asarray(x, np.int64)
    h = np.zeros(x.shape[:-1], np.uint32)
    cols = [x[..., t] for t in range(x.shape[-1])] + [np.asarray(y, np.int64)]
    for v in cols:
        h += np.uint32(GOLDEN)  # wraps mod 2**32 (uint32 arrays)
        h ^= v.astype(np.uint32)
        h = mix32(h)
    return h


def row_keys(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """r(s, t): x (n, b, T), y (n, b) -> uint32 (n, b*T), row s*T + t (seq_targets' order)."""
    n, b, T = x.shape
    h = sample_keys(x, y)  # (n, b)
    return mix32(h[..., None] ^ _mul32(np.arange(T), ROW)[None, None, :]).reshape(n, b * T)


def uniforms(keys: np.ndarray, classes: int) -> np.ndarray:
    """u(s, t, c) in [0, 1): keys (..., R) -> float64 (..., R, C)."""
    k = np.asarray(keys, np.uint32)[..., None] + _mul32(np.arange(classes), GOLDEN)
    return mix32(k).astype(np.float64) * TWO_M32


def quantize_stochastic(dz: np.ndarray, eg: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """q = clamp(floor(dz * 2**-eg + u), -127, 127) as float64 integers: dz (n, R, C) float64,
    eg (n,) the exponent per micro-batch, keys (n, R) from :func:`row_keys`. One IEEE multiply
    (exact: a power of two), one add, floor, in this order (JS ``quantizeStochastic``)."""
    x = np.multiply(dz, pow2(-np.asarray(eg, np.int64)).reshape((-1,) + (1,) * (dz.ndim - 1)))
    x += uniforms(keys, dz.shape[-1])
    np.floor(x, out=x)
    return np.clip(x, -127.0, 127.0, out=x)


def quantize_errors(dz: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(G, eg): eg = quant_exponent(max|dz|) per micro-batch (as the round-half-up rule's),
    G = :func:`quantize_stochastic` (before the zero-sum step)."""
    eg = quant_exponent(np.abs(dz).reshape(dz.shape[0], -1).max(axis=1))
    return quantize_stochastic(dz, eg, keys), eg

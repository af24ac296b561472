"""Stochastic rounding of a sequence model's errors (docs/ENGINE.md, "Loss (sequence models)"
and "The transformer"; issue 37): the output error's, and every requantize of an error in
the backward pass (:func:`requantize_errors`, below).

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

from daisychain.compiled import built_once, numba_jit
from daisychain.engine.detmath import exponent, pow2, quant_exponent
from daisychain.engine.prng import M32, mix32

GOLDEN = 0x9E3779B9
ROW = 0x85EBCA6B
SITE = 0x27D4EB2F
SITES = 16  #: requantize sites per layer in the site key (a block has 13)
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


# ---------------------------------------------------------------------- the backward's errors
def site_key(li: int, j: int) -> int:
    """sigma(li, j) = mix32((li * 16 + j) ^ 0x27D4EB2F): requantize site j of layer li."""
    return int(mix32(np.array([((li * SITES + j) ^ SITE) & M32], np.uint32))[0])


def error_offsets(keys: np.ndarray, L: int, s: np.ndarray) -> np.ndarray:
    """r(s, i) in [0, 2**sh): keys (n, b) = mix32(h ^ sigma) per sample, sh (n,) the shift per
    micro-batch -> int64 (n, b, L): u = mix32(key + i * 0x9E3779B9), r = (u << max(0, sh -
    32)) >> max(0, 32 - sh) (the top sh bits of u; sh = 0: r = 0)."""
    u = mix32(np.asarray(keys, np.uint32)[..., None] + _mul32(np.arange(L), GOLDEN)[None, None, :])
    sh = np.asarray(s, np.int64).reshape(-1, 1, 1)
    return (u.astype(np.int64) << np.maximum(sh - 32, 0)) >> np.maximum(32 - sh, 0)


def requantize_errors(V, e, skeys, site: int, mask=None, sums: bool = False, compiled: bool = False,
                      dtype=np.float64, unit=None):
    """A sequence model's backward requantize of an error, rounded stochastically:
    sh = max(0, bitlen(max|V|) - 7) per micro-batch (as the round-half-up rule's), q =
    clamp(floor((V + r) / 2**sh), -127, 127), r from :func:`error_offsets` with the keys
    mix32(h(s) ^ site) of the micro-batch's samples ``skeys`` (n, b) (:func:`sample_keys`).
    That is the requantize unit (round half up) of V + r - 2**sh / 2 (0 for sh = 0) with
    shift sh: ``unit`` (eng._requantize: the reference route reads the table) computes it so.
    V (n, ..., C): integers below 2**53 (any dtype), each micro-batch's elements b equal
    consecutive runs, one per sample, in order; element i of a sample is its index in that
    run. ``mask``: V * (mask > 0) first (the ReLU's error mask). Returns (q of ``dtype`` in V's
    shape, e + sh, the int8 out's sum over everything but its last axis per micro-batch
    (n, C) int64 where ``sums``, else None). ``compiled``: the numba loop (the same integers)."""
    V = np.asarray(V)
    n, b = np.shape(skeys)
    C = V.shape[-1]
    keys = mix32(np.asarray(skeys, np.uint32) ^ np.uint32(site))
    e = np.broadcast_to(np.asarray(e, np.int64), (n,))
    k = kernels() if compiled else None
    if k is not None:
        Vc = np.ascontiguousarray(V)
        M = (np.ascontiguousarray(mask).reshape(n, b, -1, C) if mask is not None
             else np.empty((0, 1, 1, 1), np.int8))
        out = np.empty(V.shape, dtype)
        e_out = np.empty(n, np.int64)
        S = np.empty((n, C) if sums else (0, 1), np.int64)
        k.sround_rq8(Vc.reshape(n, b, -1, C), M, keys.astype(np.int64), e.copy(), out.reshape(n, b, -1, C),
                     e_out, S)
        return out, e_out, (S if sums else None)
    Vi = V.astype(np.int64).reshape(n, b, -1)
    if mask is not None:
        Vi = np.where(np.asarray(mask).reshape(n, b, -1) > 0, Vi, 0)
    sh = np.maximum(exponent(np.abs(Vi).reshape(n, -1).max(axis=1).astype(np.float64)) - 7, 0)
    Vr = Vi + error_offsets(keys, Vi.shape[2], sh)
    if unit is not None:
        q = unit((Vr - ((1 << sh) >> 1).reshape(-1, 1, 1)).astype(np.float64), sh).astype(np.int64)
    else:
        q = np.clip(Vr >> sh.reshape(-1, 1, 1), -127, 127)
    S = q.reshape(n, -1, C).sum(axis=1) if sums else None
    return q.astype(dtype).reshape(V.shape), e + sh, S


_U = np.uint64


def _nb_mix32(x):
    """prng.mix32 of x (uint64 below 2**32) in uint64 arithmetic, masked to 32 bits."""
    x ^= x >> _U(16)
    x = (x * _U(0x7FEB352D)) & _U(M32)
    x ^= x >> _U(15)
    x = (x * _U(0x846CA68B)) & _U(M32)
    x ^= x >> _U(16)
    return x


def _nb_sround_rq8(V, mask, keys, e, out, e_out, sums):
    """requantize_errors on V (n, b, P, C) (integers, |V| < 2**53) with keys (n, b) the
    per-sample keys mix32(h ^ sigma), mask (n, b, P, C) or (0, ...), sums (n, C) or (0, 1):
    the integer rule, element i = p * C + c of sample s."""
    n, b, P, C = V.shape
    use_mask, want = mask.shape[0] > 0, sums.shape[0] > 0
    for i in range(n):
        m = np.int64(0)
        for s_ in range(b):
            for p in range(P):
                for c in range(C):
                    a = np.int64(V[i, s_, p, c])
                    if use_mask and mask[i, s_, p, c] <= 0:
                        a = 0
                    a = a if a >= 0 else -a
                    m = a if a > m else m
        sh = 0
        while (m >> sh) > 0:  # bitlen(m)
            sh += 1
        sh = max(sh - 7, 0)
        up, dn = max(sh - 32, 0), max(32 - sh, 0)
        if want:
            for c in range(C):
                sums[i, c] = 0
        for s_ in range(b):
            k = _U(keys[i, s_])
            idx = _U(0)
            for p in range(P):
                for c in range(C):
                    u = _nb_mix32((k + idx * _U(0x9E3779B9)) & _U(M32))
                    idx += _U(1)
                    v = np.int64(V[i, s_, p, c])
                    if use_mask and mask[i, s_, p, c] <= 0:
                        v = 0
                    x = (v + ((np.int64(u) << up) >> dn)) >> sh
                    x = min(max(x, -127), 127)
                    out[i, s_, p, c] = x
                    if want:
                        sums[i, c] += x
        e_out[i] = e[i] + sh


def _build():
    """The compiled loop, or None without numba (the numpy rule runs)."""
    jit = numba_jit()
    if jit is None:
        return None
    import types

    g = globals()
    k = types.SimpleNamespace()
    for name in ("mix32", "sround_rq8"):
        g["_nb_" + name] = jit(g["_nb_" + name])
        setattr(k, name, g["_nb_" + name])
    return k


kernels = built_once(_build)

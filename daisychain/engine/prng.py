"""The integer PRNG and the deterministic shuffle (see docs/ENGINE.md, "Randomness").

Counter-based, 32-bit, so numpy (uint32 arrays, which wrap) and JS (``Math.imul``, ``>>>``)
give the same bits, and any element can be drawn without drawing the ones before it::

    mix32(x):  x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16
    key(seed, stream) = mix32(seed ^ (stream * 0x85ebca6b))
    u32(seed, stream, i) = mix32(key(seed, stream) + i * 0x9e3779b9)

all arithmetic mod 2**32. ``uniform = u32 * 2**-32`` lies in [0, 1) and is exact in float64.
No library RNG is used for anything that feeds the parameters.
"""

from __future__ import annotations

import numpy as np

M32 = 0xFFFFFFFF

#: streams (the second argument of u32): parameter tensors use their index in the
#: canonical order; data order and splits have their own ranges so they never collide.
STREAM_PARAM = 0  #: + canonical tensor index
STREAM_SPLIT = 1 << 20  #: train/test split of a dataset
STREAM_SHUFFLE = 1 << 21  #: + epoch


def mix32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.uint32).copy()
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def check_seed(seed: int) -> int:
    if not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) <= M32:
        raise ValueError(f"seed must be an integer in [0, {M32}], got {seed!r}")
    return int(seed)


def key(seed: int, stream: int) -> np.uint32:
    s = (check_seed(seed) ^ ((stream * 0x85EBCA6B) & M32)) & M32
    return mix32(np.array([s], np.uint32))[0]


def u32(seed: int, stream: int, count: int, start: int = 0) -> np.ndarray:
    """u32(seed, stream, i) for i in [start, start + count)."""
    i = np.arange(start, start + count, dtype=np.uint64)
    weyl = ((i * np.uint64(0x9E3779B9)) + np.uint64(int(key(seed, stream)))) & np.uint64(M32)
    return mix32(weyl.astype(np.uint32))


def uniform(seed: int, stream: int, count: int) -> np.ndarray:
    """Floats in [0, 1): u32 * 2**-32 (exact)."""
    return u32(seed, stream, count).astype(np.float64) * 2.3283064365386963e-10  # 2**-32, exact


def permutation(seed: int, stream: int, n: int) -> np.ndarray:
    """A permutation of range(n): indices sorted by (u32(seed, stream, i), i)."""
    keys = u32(seed, stream, n)
    return np.lexsort((np.arange(n), keys)).astype(np.int64)

"""The exact int8 x int8 -> int32 GEMM of the engine's fast paths (engine/convfast.py,
engine/attnfast.py), on whichever of two exact kernels is faster on this machine:

* ``int``: torch's ``_int_mm`` (int8 operands, int32 accumulators). Fast where the CPU has
  int8 dot products (VNNI); on a CPU without them (an AMD EPYC with AVX2 only, measured:
  ~1.7 G int-ops/s, 25x slower than its float32 GEMM) it is most of an image step.
* ``f32``: torch's float32 GEMM over K chunks of at most MAX_K_FLOAT32 (1024) columns, each
  chunk's result rounded to int32 and the chunks summed in int32. Exact: every product of two
  int8 values is at most 2**14 in magnitude, so every partial sum of a chunk, in any order
  and with or without fused multiply-adds, is an integer of magnitude at most 2**24, which
  float32 holds exactly; the sum of the chunks is the int32 sum ``_int_mm`` makes (the
  callers keep K <= MAX_K, so it does not overflow).

Both give the same int32 bytes for every input (tests/engine/test_int8mm.py). The choice is
made once per process from the CPU's flags (``kernel()``), or set with
``DAISY_INT8_GEMM=int|f32``; it changes speed only, never a bit.
"""

from __future__ import annotations

import os
import time

import numpy as np

from daisychain.units.gemm import MAX_K_FLOAT32

KERNELS = ("int", "f32")
_CHOSEN: list[str] = []


def _torch():
    import torch

    return torch


def _writable(a: np.ndarray) -> np.ndarray:
    return a if a.flags.writeable else a.copy()  # torch.from_numpy warns on a read-only view


def mm_f32(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a (M, K) @ b (K, N), int8-valued, as int32 through float32 chunks of K (exact)."""
    t = _torch()
    K = a.shape[1]
    res = None
    for k0 in range(0, max(K, 1), MAX_K_FLOAT32):
        k1 = min(K, k0 + MAX_K_FLOAT32)
        ta = t.from_numpy(_writable(np.ascontiguousarray(a[:, k0:k1]) if K > MAX_K_FLOAT32 else a)).float()
        tb = t.from_numpy(_writable(np.ascontiguousarray(b[k0:k1]) if K > MAX_K_FLOAT32 else b)).float()
        part = t.mm(ta, tb).to(t.int32)
        res = part if res is None else res.add_(part)
    if res is None:  # K = 0
        res = t.zeros((a.shape[0], b.shape[1]), dtype=t.int32)
    if out is not None:
        out[...] = res.numpy()
        return out
    return res.numpy()


def mm_int(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a (M, K) @ b (K, N), int8, as int32 through torch's ``_int_mm`` (every dimension >= 2:
    torch 2.13 misreads a one-row operand, the callers route those to an exact int64 product)."""
    t = _torch()
    if out is None:
        return t._int_mm(t.from_numpy(a), t.from_numpy(b)).numpy()
    t._int_mm(t.from_numpy(a), t.from_numpy(b), out=t.from_numpy(out))
    return out


def _time(fn, a, b, reps: int = 5) -> float:
    fn(a, b)  # warm
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(a, b)
        best = min(best, time.perf_counter() - t0)
    return best


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags (Linux's /proc/cpuinfo), or None where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def kernel() -> str:
    """This process's kernel: ``DAISY_INT8_GEMM`` when set (int or f32); else on an x86 CPU
    ``int`` where it has int8 dot products (``avx512_vnni`` or ``avx_vnni``), ``f32``
    where it has not; else the faster of the two on a small GEMM, timed once."""
    if not _CHOSEN:
        want = os.environ.get("DAISY_INT8_GEMM", "").strip()
        flags = _cpu_flags()
        if want in KERNELS:
            _CHOSEN.append(want)
        elif flags is not None and "avx2" in flags:
            _CHOSEN.append("int" if flags & {"avx512_vnni", "avx_vnni"} else "f32")
        else:
            rng = np.random.default_rng(0)
            a = rng.integers(-128, 128, (512, 144), dtype=np.int8)
            b = rng.integers(-128, 128, (144, 16), dtype=np.int8)
            _CHOSEN.append("int" if _time(mm_int, a, b) <= _time(mm_f32, a, b) else "f32")
    return _CHOSEN[0]


def mm(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The exact int32 a @ b of int8 a (M, K) and b (K, N), every dimension >= 2, on
    this process's kernel (into ``out`` when given)."""
    return (mm_int if kernel() == "int" else mm_f32)(a, b, out)

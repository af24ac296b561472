"""The unit GEMM: int8 matrices -> int32 accumulators, every product from the ``mul`` unit.

Two implementations that must give the same bytes:

* :func:`gemm_lut` — the literal one: each of the M*N*K products is looked up in the verified
  multiply table and accumulated in int32.
* :func:`gemm_fast` — an exact fast one: a BLAS matmul on the same integers held in floats.
  It is exact because (1) the loaded multiply table was checked to equal ``a * b`` on all
  65,536 pairs, so summing table entries is summing true products, and (2) every partial
  sum is an integer of magnitude at most ``K * 128 * 128 = K * 2**14``: float32 represents
  all integers below ``2**24`` exactly (so K <= 1024 is exact in float32) and float64 all
  integers below ``2**53``; an IEEE sum of two exactly representable integers whose result
  is representable is exact, whatever order BLAS chooses.

Accumulators are int32: a GEMM whose worst case ``K * 2**14`` could exceed ``2**31 - 1``
(K > 131071) is refused.
"""

from __future__ import annotations

import numpy as np

from daisychain.units import reference as ref
from daisychain.units.luts import LutSet, load_luts
from daisychain.units.ops import check_int8

#: the largest inner dimension whose int32 accumulator cannot overflow
MAX_K = (2**31 - 1) // (128 * 128)
#: the largest inner dimension a float32 BLAS sum is exact for (K * 2**14 <= 2**24)
MAX_K_FLOAT32 = 2**24 // (128 * 128)


def _check_operands(a, b):
    a = check_int8("gemm", "A", a)
    b = check_int8("gemm", "B", b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"gemm: shapes must be (M, K) and (K, N), got {a.shape} and {b.shape}")
    if a.shape[1] > MAX_K:
        raise ValueError(f"gemm: K = {a.shape[1]} could overflow the int32 accumulator (max {MAX_K})")
    return a, b


def gemm_lut(a, b, luts: LutSet | None = None) -> np.ndarray:
    """C[m, n] = sum_k mul(A[m, k], B[k, n]), each product read from the table; int32."""
    luts = luts or load_luts()
    a, b = _check_operands(a, b)
    m, k = a.shape
    n = b.shape[1]
    rows = (a.astype(np.int64) + 128) * 256  # (M, K)
    cols = b.astype(np.int64) + 128  # (K, N)
    acc = np.zeros((m, n), dtype=np.int32)
    for kk in range(k):
        acc += luts.mul[rows[:, kk, None] + cols[None, kk, :]]
    return acc


def gemm_fast(a, b, luts: LutSet | None = None) -> np.ndarray:
    """Same bytes as :func:`gemm_lut`, by an exact float BLAS matmul (see module docstring)."""
    luts = luts or load_luts()
    require_exact_mul(luts)
    a, b = _check_operands(a, b)
    dtype = np.float32 if a.shape[1] <= MAX_K_FLOAT32 else np.float64
    return (a.astype(dtype) @ b.astype(dtype)).astype(np.int32)


_EXACT_CHECKED: set[str] = set()
_ALL_EXACT: dict[str, bool] = {}


def tables_are_exact(luts: LutSet) -> bool:
    """True when all three tables equal their definitions (``reference.exact_tables``):
    then ``requantize(acc, s) == clamp(floor(acc * 2**-s + 1/2), -127, 127)`` and
    ``relu(x) == max(x, 0)`` exactly, and an engine may compute them by arithmetic instead
    of gathers (same bits). Checked once per table set."""
    key = luts.manifest_sha256
    if key not in _ALL_EXACT:
        want = ref.exact_tables()
        _ALL_EXACT[key] = all(np.array_equal(luts.tables()[name], want[name]) for name in want)
    return _ALL_EXACT[key]


def require_exact_mul(luts: LutSet) -> None:
    """The fast path is valid only for a multiply table equal to a*b: check it once per set."""
    key = luts.manifest_sha256
    if key in _EXACT_CHECKED:
        return
    a, b = np.meshgrid(np.arange(-128, 128), np.arange(-128, 128), indexing="ij")
    if not np.array_equal(luts.mul.astype(np.int64), ref.mul_exact(a.ravel(), b.ravel())):
        raise ValueError("gemm_fast: the loaded multiply table is not the exact product table")
    _EXACT_CHECKED.add(key)

"""The INT8 units — multiply, requantize, ReLU — computed through their verified tables.

Every function checks its operands and raises ``ValueError`` naming the unit and the range;
nothing wraps silently. Definitions (also in ``docs/UNITS.md``):

* ``mul(a, b)``: int8 x int8 -> the exact product (int32), looked up in the multiply table.
* ``requantize(acc, shift)``: int32 accumulator -> int8 in ``[-127, 127]``:
  ``clamp(floor(acc / 2**shift + 1/2), -127, 127)`` (rounding right shift, round half up,
  symmetric saturation). Done with int32 operations only: the accumulator is routed to a
  16-bit index (:func:`daisychain.units.reference.rq_route`) and the table does the final
  rounding shift by 7 and the saturation.
* ``relu(x)``: int8 -> int8, ``max(x, 0)``, from the ReLU table.
"""

from __future__ import annotations

import numpy as np

from daisychain.units import reference as ref
from daisychain.units.luts import LutSet, load_luts


def _check_int(unit: str, name: str, x, lo: int, hi: int) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{unit}: {name} must be an integer array, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
        bad = arr.ravel()[np.flatnonzero((arr.ravel() < lo) | (arr.ravel() > hi))[0]]
        raise ValueError(f"{unit}: {name} must lie in [{lo}, {hi}], got {int(bad)}")
    return arr


def check_int8(unit: str, name: str, x) -> np.ndarray:
    return _check_int(unit, name, x, ref.INT8_MIN, ref.INT8_MAX)


def check_shift(unit: str, shift) -> int:
    if isinstance(shift, (bool, np.bool_)) or not isinstance(shift, (int, np.integer)):
        raise ValueError(f"{unit}: shift must be an integer, got {type(shift).__name__}")
    if not 0 <= int(shift) <= ref.MAX_SHIFT:
        raise ValueError(f"{unit}: shift must lie in [0, {ref.MAX_SHIFT}], got {int(shift)}")
    return int(shift)


def mul(a, b, luts: LutSet | None = None) -> np.ndarray:
    """Exact int8 x int8 products (broadcasting), taken from the multiply table."""
    luts = luts or load_luts()
    a = check_int8("mul", "a", a)
    b = check_int8("mul", "b", b)
    return luts.mul[ref.mul_index(a, b)]


def relu(x, luts: LutSet | None = None) -> np.ndarray:
    """ReLU of int8 values, from the ReLU table (int8 result)."""
    luts = luts or load_luts()
    x = check_int8("relu", "x", x)
    return luts.relu[x.astype(np.int64) + 128].astype(np.int8)


def requantize(acc, shift, luts: LutSet | None = None) -> np.ndarray:
    """int32 accumulators -> int8 by a rounding right shift of ``shift`` bits, saturated to ±127."""
    luts = luts or load_luts()
    acc = _check_int("requantize", "acc", acc, ref.INT32_MIN, ref.INT32_MAX)
    shift = check_shift("requantize", shift)
    return luts.requantize[ref.rq_route(acc, shift) + 32768].astype(np.int8)

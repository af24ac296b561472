"""The units' exact definitions in plain integer arithmetic, and their table layouts.

This module is the definition the trained units are verified against and that every
engine (numpy, JS, WGSL) reproduces. It uses only Python/numpy integers, never a table.

Ranges
------
* int8 operand: an integer in ``[-128, 127]``.
* int8 activation (what ``requantize`` produces): ``[-127, 127]`` (symmetric saturation).
* int32 accumulator: ``[-2**31, 2**31 - 1]``.
* shift: an integer in ``[0, 31]``.
"""

from __future__ import annotations

import numpy as np

INT8_MIN, INT8_MAX = -128, 127
SAT = 127  #: requantize saturates symmetrically to [-SAT, SAT]
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_SHIFT = 31

#: Table layouts. Every table is little-endian int32, indexed as written here.
MUL_SIZE = 256 * 256  #: mul[(a + 128) * 256 + (b + 128)] == a * b
RQ_SIZE = 65536  #: rq[x + 32768] == clamp(floor((x + 64) / 128), -127, 127), x int16
RELU_SIZE = 256  #: relu[x + 128] == max(x, 0)

#: requantize routes its accumulator through the 16-bit table with a fixed shift of 7.
RQ_TABLE_SHIFT = 7

#: The exp unit (the transformer's softmax, docs/ENGINE.md "The exp unit"): int8 z with
#: EXP_FRAC fractional bits; exp[z + 128] == floor(EXP_ONE * exp(min(z, 0) / 2**EXP_FRAC) + 1/2)
EXP_SIZE = 256
EXP_FRAC = 4
EXP_ONE = 32768


def mul_index(a, b):
    return (np.asarray(a, np.int64) + 128) * 256 + (np.asarray(b, np.int64) + 128)


def mul_exact(a, b):
    """a * b for int8 operands (int64 result)."""
    return np.asarray(a, np.int64) * np.asarray(b, np.int64)


def relu_exact(x):
    """max(x, 0) for int8 x."""
    return np.maximum(np.asarray(x, np.int64), 0)


def rq_table_exact(x):
    """The 16-bit requantize table: clamp(floor((x + 64) / 128), -127, 127) for int16 x."""
    x = np.asarray(x, np.int64)
    return np.clip((x + 64) >> RQ_TABLE_SHIFT, -SAT, SAT)


def requantize_exact(acc, shift: int):
    """clamp(floor(acc / 2**shift + 1/2), -127, 127): rounding right shift, round half up.

    Computed with Python-size integers, so it is the definition, free of overflow.
    """
    acc = np.asarray(acc, np.int64)
    if shift == 0:
        return np.clip(acc, -SAT, SAT)
    return np.clip((acc + (1 << (shift - 1))) >> shift, -SAT, SAT)


def rq_route(acc, shift: int):
    """Map an int32 accumulator and a shift to the 16-bit index x of the requantize table.

    This is the int32-only part of ``requantize`` (what WGSL can do without i64):

    * ``shift >= 7``: ``x = clamp(acc >> (shift - 7), -32768, 32767)``. Exact because
      ``floor(floor(acc / 2**k) / 128 + 1/2) == floor((acc + 2**(k+6)) / 2**(k+7))`` for
      integers (nested floor division), and saturation is monotone so clamping first to
      the int16 range cannot change a saturated result.
    * ``shift < 7``: ``x = clamp(acc, -2**(8+shift), 2**(8+shift) - 1) << (7 - shift)``.
      The clamp only touches accumulators that saturate anyway (|acc| > 127.5 * 2**shift),
      and the left shift then fits int16.
    """
    acc = np.asarray(acc, np.int64)
    s = np.asarray(shift, np.int64)  # may be an array broadcasting against acc
    down = np.clip(acc >> np.maximum(s - RQ_TABLE_SHIFT, 0), -32768, 32767)
    lim = np.left_shift(np.int64(1), 8 + np.minimum(s, RQ_TABLE_SHIFT))
    up = np.clip(acc, -lim, lim - 1) << np.maximum(RQ_TABLE_SHIFT - s, 0)
    return np.where(s >= RQ_TABLE_SHIFT, down, up)


def exp_table_exact() -> np.ndarray:
    """The exp unit's table (int64, 256 entries, index z + 128): floor(32768 * e**(min(z, 0)/16)
    + 1/2), computed with 50-digit decimal arithmetic (exact: e**(z/16) is never a
    half-integer multiple of 2**-15, so no rounding tie can occur)."""
    from decimal import Decimal, localcontext

    out = []
    with localcontext() as ctx:
        ctx.prec = 50
        for z in range(-128, 128):
            v = Decimal(EXP_ONE) * (Decimal(min(z, 0)) / Decimal(2**EXP_FRAC)).exp()
            out.append(int((v + Decimal("0.5")).to_integral_value(rounding="ROUND_FLOOR")))
    return np.array(out, np.int64)


def exact_tables() -> dict[str, np.ndarray]:
    """The tables a correct exporter must produce (int32), from the definitions above."""
    a, b = np.meshgrid(np.arange(-128, 128), np.arange(-128, 128), indexing="ij")
    return {
        "mul": mul_exact(a.ravel(), b.ravel()).astype(np.int32),
        "requantize": rq_table_exact(np.arange(-32768, 32768)).astype(np.int32),
        "relu": relu_exact(np.arange(-128, 128)).astype(np.int32),
        "exp": exp_table_exact().astype(np.int32),
    }

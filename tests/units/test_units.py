"""The units against plain integer arithmetic, exhaustively where the domain allows."""

from __future__ import annotations

import numpy as np
import pytest

from daisychain.units import MAX_K, gemm_fast, gemm_lut, load_luts, mul, relu, requantize
from daisychain.units import reference as ref

RNG = np.random.default_rng(7)


def test_mul_all_65536_pairs():
    a, b = np.meshgrid(np.arange(-128, 128), np.arange(-128, 128), indexing="ij")
    got = mul(a, b)
    assert got.dtype == np.int32
    assert np.array_equal(got.astype(np.int64), a.astype(np.int64) * b)


def test_relu_all_256():
    x = np.arange(-128, 128)
    assert np.array_equal(relu(x), np.where(x > 0, x, 0))


def _requantize_python(acc: int, s: int) -> int:
    """Python big-int definition: clamp(floor(acc / 2**s + 1/2), -127, 127)."""
    q = (2 * acc + (1 << s)) // (2 << s) if s else acc
    return max(-127, min(127, q))


def test_requantize_edges_every_shift():
    for s in range(32):
        cands = {0, 1, -1, ref.INT32_MAX, ref.INT32_MIN, ref.INT32_MAX - 1, ref.INT32_MIN + 1}
        for t in range(120, 130):
            for base in (t << s, (t << s) - (1 << s >> 1) if s else t):
                cands |= {base - 1, base, base + 1, -base - 1, -base, -base + 1}
        if s:
            cands |= {1 << (s - 1), -(1 << (s - 1)), (1 << (s - 1)) - 1, -(1 << (s - 1)) - 1}
        accs = np.array(sorted(c for c in cands if ref.INT32_MIN <= c <= ref.INT32_MAX), np.int64)
        got = requantize(accs, s)
        want = [_requantize_python(int(v), s) for v in accs]
        assert got.tolist() == want, f"shift {s}"


def test_requantize_million_random_accumulators():
    accs = RNG.integers(ref.INT32_MIN, ref.INT32_MAX, 1_000_000, endpoint=True)
    # a realistic mix: most accumulators are small relative to the shift
    accs[::2] >>= RNG.integers(0, 31, accs[::2].size)
    shifts = RNG.integers(0, 32, accs.size)
    for s in range(32):
        sel = shifts == s
        want = np.clip(np.floor_divide(2 * accs[sel].astype(object) + (1 << s), 2 << s)
                       if s else accs[sel], -127, 127).astype(np.int64)
        assert np.array_equal(requantize(accs[sel], s).astype(np.int64), want), f"shift {s}"


def test_requantize_table_is_its_definition():
    x = np.arange(-32768, 32768)
    assert np.array_equal(load_luts().requantize, ref.rq_table_exact(x))


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 7), (17, 33, 9), (64, 64, 64),
                                   (33, 1041, 5), (2, 4097, 3), (130, 2, 65)])
def test_gemm_lut_equals_fast(shape):
    m, k, n = shape
    a = RNG.integers(-128, 128, (m, k))
    b = RNG.integers(-128, 128, (k, n))
    lit, fast = gemm_lut(a, b), gemm_fast(a, b)
    assert lit.dtype == fast.dtype == np.int32
    assert lit.tobytes() == fast.tobytes()
    assert np.array_equal(lit.astype(np.int64), a.astype(np.int64) @ b)


def test_gemm_extreme_accumulation_is_exact():
    k = 4097  # past float32's exact range: the fast path must switch to float64
    a = np.full((2, k), -128)
    b = np.full((k, 2), -128)
    assert (gemm_fast(a, b) == k * 16384).all()
    assert (gemm_lut(a, b) == k * 16384).all()


@pytest.mark.parametrize("fn,args,msg", [
    (mul, (np.array([128]), np.array([0])), r"mul: a must lie in \[-128, 127\], got 128"),
    (mul, (np.array([0]), np.array([-129])), r"mul: b must lie in \[-128, 127\], got -129"),
    (mul, (np.array([1.0]), np.array([1])), r"mul: a must be an integer array"),
    (relu, (np.array([300]),), r"relu: x must lie in \[-128, 127\]"),
    (relu, (np.array([True]),), r"relu: x must be an integer array"),
    (requantize, (np.array([2**31]), 3), r"requantize: acc must lie in"),
    (requantize, (np.array([5]), 32), r"requantize: shift must lie in \[0, 31\], got 32"),
    (requantize, (np.array([5]), 1.5), r"requantize: shift must be an integer"),
    (gemm_lut, (np.zeros((2, 3), int), np.zeros((4, 2), int)), r"gemm: shapes must be"),
    (gemm_fast, (np.full((1, 2), 200), np.zeros((2, 1), int)), r"gemm: A must lie in"),
])
def test_bad_operands_raise_value_error_naming_unit(fn, args, msg):
    with pytest.raises(ValueError, match=msg):
        fn(*args)


def test_gemm_refuses_k_that_could_overflow():
    with pytest.raises(ValueError, match="overflow the int32 accumulator"):
        gemm_fast(np.zeros((1, MAX_K + 1), np.int8), np.zeros((MAX_K + 1, 1), np.int8))

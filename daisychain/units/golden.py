"""Golden vectors for the units and the unit GEMM, for the JS and WGSL engines to match.

``python -m daisychain.units.golden`` rewrites ``daisychain/golden/units.json``; a test
checks that the committed file equals what this module produces, so it cannot drift.

Format (all integers, so JSON is lossless here)::

    {"manifest_sha256": str,
     "mul":        {"a": [int], "b": [int], "out": [int]},
     "relu":       {"x": [int], "out": [int]},
     "exp":        {"z": [int], "out": [int]},          # the exp unit (an extra unit)
     "requantize": {"acc": [int], "shift": [int], "out": [int]},
     "gemm": [{"name": str, "m": int, "k": int, "n": int,
               "a": [int] | null, "b": [int] | null,   # row-major (m,k) and (k,n)
               "a_fill": int | null, "b_fill": int | null,  # constant matrices instead
               "out": [int] | null,                     # row-major (m,n), omitted when large
               "out_sha256": str}]}                     # SHA-256 of the int32 LE output
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from daisychain.units import gemm_fast, load_luts, mul, relu, requantize
from daisychain.units import reference as ref
from daisychain.units.gemm import MAX_K

PATH = Path(__file__).resolve().parent.parent / "golden" / "units.json"

GEMM_SHAPES = [  # (name, m, k, n): awkward shapes, not multiples of any workgroup size
    ("1x1x1", 1, 1, 1), ("1x7x1", 1, 7, 1), ("3x5x7", 3, 5, 7), ("17x33x9", 17, 33, 9),
    ("8x64x8", 8, 64, 8), ("64x64x64", 64, 64, 64), ("65x130x63", 65, 130, 63),
    ("2x300x5", 2, 300, 5), ("128x1x3", 128, 1, 3), ("31x257x33", 31, 257, 33),
    ("16x64x10", 16, 64, 10),
]


def _requantize_cases(rng) -> tuple[list[int], list[int]]:
    accs, shifts = [], []
    for s in range(ref.MAX_SHIFT + 1):
        edge = {0, 1, -1, 2, -2, ref.INT32_MAX, ref.INT32_MIN, ref.INT32_MAX - 1, ref.INT32_MIN + 1}
        if s:
            half = 1 << (s - 1)
            edge |= {half, -half, half - 1, -half - 1, half + 1, -half + 1}
        for t in (127, 128, 126):  # around the saturation point (t - 1/2) * 2**s
            c = (2 * t - 1) << s >> 1 if s else t
            edge |= {c - 1, c, c + 1, -c - 1, -c, -c + 1}
        edge = sorted(v for v in edge if ref.INT32_MIN <= v <= ref.INT32_MAX)
        rand = rng.integers(ref.INT32_MIN, ref.INT32_MAX, size=24, endpoint=True)
        small = rng.integers(-(1 << min(30, s + 9)), 1 << min(30, s + 9), size=24)
        for v in [*edge, *rand.tolist(), *small.tolist()]:
            accs.append(int(v))
            shifts.append(s)
    return accs, shifts


def build() -> dict:
    luts = load_luts()
    rng = np.random.default_rng(20261202)
    a = np.concatenate([[-128, -128, 127, 127, 0, -1, 1], rng.integers(-128, 128, 2000)])
    b = np.concatenate([[-128, 127, -128, 127, 0, -1, 1], rng.integers(-128, 128, 2000)])
    x = np.arange(-128, 128)
    accs, shifts = _requantize_cases(rng)
    rq_out = [int(requantize(np.array([v]), s, luts)[0]) for v, s in zip(accs, shifts)]
    gemms = []
    for name, m, k, n in GEMM_SHAPES:
        A = rng.integers(-128, 128, (m, k), dtype=np.int64)
        B = rng.integers(-128, 128, (k, n), dtype=np.int64)
        out = gemm_fast(A, B, luts)
        gemms.append({"name": name, "m": m, "k": k, "n": n, "a": A.ravel().tolist(),
                      "b": B.ravel().tolist(), "a_fill": None, "b_fill": None,
                      "out": out.ravel().tolist(), "out_sha256": _sha(out)})
    for name, m, k, n, fa, fb in [("extreme-1040", 2, 1040, 3, -128, -128),
                                  ("extreme-maxk", 1, MAX_K, 1, -128, -128),
                                  ("extreme-mixed", 3, 4097, 2, 127, -128)]:
        out = gemm_fast(np.full((m, k), fa), np.full((k, n), fb), luts)
        gemms.append({"name": name, "m": m, "k": k, "n": n, "a": None, "b": None,
                      "a_fill": fa, "b_fill": fb, "out": out.ravel().tolist(),
                      "out_sha256": _sha(out)})
    return {
        "manifest_sha256": luts.manifest_sha256,
        "mul": {"a": a.tolist(), "b": b.tolist(), "out": mul(a, b, luts).tolist()},
        "relu": {"x": x.tolist(), "out": relu(x, luts).tolist()},
        "exp": {"z": x.tolist(), "out": luts.exp[x + 128].tolist()},  # the exp unit, every input
        "requantize": {"acc": accs, "shift": shifts, "out": rq_out},
        "gemm": gemms,
    }


def _sha(out: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(out, "<i4").tobytes()).hexdigest()


def dumps(data: dict) -> str:
    return json.dumps(data, separators=(",", ":")) + "\n"


if __name__ == "__main__":
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(dumps(build()))
    print(f"wrote {PATH}")

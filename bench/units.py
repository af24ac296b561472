"""Unit-GEMM speed: the literal-table GEMM and the exact fast GEMM against torch float32.

Run: ``python -m bench.units`` (writes the "units" section of docs/BENCHMARKS.md).
One thread everywhere, so the ratios compare algorithms, not core counts.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from tqdm import tqdm

from bench._report import write_section
from daisychain.units import gemm_fast, gemm_lut, load_luts


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    torch.set_num_threads(1)
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(1)
    except ImportError:
        pass
    luts = load_luts()
    rng = np.random.default_rng(0)
    rows = []
    for n in tqdm([256, 512], desc="unit GEMM"):
        a = rng.integers(-128, 128, (n, n)).astype(np.int8)
        b = rng.integers(-128, 128, (n, n)).astype(np.int8)
        ta, tb = torch.tensor(a, dtype=torch.float32), torch.tensor(b, dtype=torch.float32)
        t_torch = _best(lambda: ta @ tb, 20)
        t_fast = _best(lambda: gemm_fast(a, b, luts), 10)
        t_lut = _best(lambda: gemm_lut(a, b, luts), 2 if n == 256 else 1)
        assert gemm_fast(a, b, luts).tobytes() == gemm_lut(a, b, luts).tobytes()
        ops = 2 * n**3
        rows.append((n, t_torch, t_fast, t_lut, ops))
    lines = ["## Unit GEMM (int8 x int8 -> int32)", "",
             "| size | torch f32 matmul (baseline) | fast exact GEMM | literal table GEMM |",
             "|---|---|---|---|"]
    for n, t_torch, t_fast, t_lut, ops in rows:
        lines.append(f"| {n}^3 | 1.00 ({ops / t_torch / 1e9:.1f} GOP/s) | "
                     f"{t_torch / t_fast:.2f} ({ops / t_fast / 1e9:.1f} GOP/s) | "
                     f"{t_torch / t_lut:.4f} ({ops / t_lut / 1e9:.2f} GOP/s) |")
    lines += ["", "Ratios are speed relative to torch float32 (higher is faster), best of "
              "several runs, one thread. Both unit GEMMs give the same bytes (checked in the run)."]
    write_section("units", "\n".join(lines), "python -m bench.units")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

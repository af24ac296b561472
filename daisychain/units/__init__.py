"""The verified INT8 units and their tables. See ``docs/UNITS.md``."""

from daisychain.units.gemm import MAX_K, gemm_fast, gemm_lut
from daisychain.units.luts import LutError, LutSet, load_luts
from daisychain.units.ops import mul, relu, requantize

__all__ = ["LutError", "LutSet", "MAX_K", "gemm_fast", "gemm_lut", "load_luts", "mul",
           "relu", "requantize"]

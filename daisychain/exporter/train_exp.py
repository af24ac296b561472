"""The exp unit as a trained, verified integer network (docs/ENGINE.md, "The exp unit").

Two stages, as the requantize unit's: a ``Linear(8, 1)`` learns the signed value z of the 8
input bits (linear in the bits, exact after snapping to 2**-4), then a 1-D network on z
with one ReLU per knot, ``relu(z - k)`` for k = -128..0, whose output layer is solved by
float64 least squares and snapped to 2**-10 (the exact solution is the table's integer
second differences, so the snap is exact when the solve is). The integer network is
evaluated in int64 on all 256 inputs and must equal ``reference.exp_table_exact`` on every
one; a seed whose network is wrong anywhere is refused and the next one tried.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

from daisychain.exporter.train_units import (HIDDEN_FRAC, OUT_FRAC, UnitResult, _lbfgs, _lstsq_out,
                                             _round_shift, _seed_loop, _snap, bits, verify)
from daisychain.units import reference as ref

KNOTS = np.arange(-128, 1)  #: relu(z - k): one hidden unit per knot


def _exp_try(seed: int, bar: tqdm, max_iter: int) -> tuple[np.ndarray, float]:
    g = torch.Generator().manual_seed(seed)
    z = np.arange(-128, 128)
    zb = bits(z, 8)
    # stage 1: z from its two's-complement bits (linear in the bits)
    X = torch.tensor(zb, dtype=torch.float64)
    t1 = torch.tensor(z / 128.0, dtype=torch.float64)
    w = (torch.randn(8, generator=g, dtype=torch.float64) * 0.1).requires_grad_()
    b0 = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    _lbfgs([w, b0], lambda: torch.mean((X @ w + b0 - t1) ** 2), max_iter, bar)
    W1 = _snap(w.detach().numpy() * 128.0, HIDDEN_FRAC)
    B1 = _snap(b0.detach().numpy() * 128.0, HIDDEN_FRAC)
    z1 = _round_shift(zb @ W1 + B1[0], HIDDEN_FRAC)
    verify("exp stage 1", z1, z, lambda i: f"decode(z={z[i]})")
    # stage 2: the knot layer, output layer by least squares on the whole domain
    want = ref.exp_table_exact()
    H = np.maximum(z1[:, None] - KNOTS[None, :], 0)  # (256, 129) integers
    feats = np.concatenate([H, np.ones((len(z), 1), np.int64)], 1)
    sol = _lstsq_out(feats, want)
    V = _snap(sol, OUT_FRAC)
    Y = feats @ V  # value * 2**OUT_FRAC, int64
    residual = float(np.max(np.abs(feats @ sol - want)))
    return _round_shift(Y, OUT_FRAC), residual


def train_exp(base_seed: int = 0, max_iter: int = 200) -> UnitResult:
    return _seed_loop("exp", base_seed, max_iter, _exp_try, ref.exp_table_exact(),
                      lambda i: f"exp(z={i - 128})")

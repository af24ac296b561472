"""The engine's exact int8 GEMM (engine/int8mm.py): torch's ``_int_mm`` and the float32 GEMM over
K chunks of at most 1024 give the same int32 bytes, the extremes (-128 x -128 summed K times)
and chunked K included; the kernel a process picks changes no bit of a training step."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from daisychain.engine import int8mm
from daisychain.units.gemm import MAX_K, MAX_K_FLOAT32


@pytest.mark.parametrize("K", [2, 3, 1023, MAX_K_FLOAT32, MAX_K_FLOAT32 + 1, 3 * MAX_K_FLOAT32 + 7, MAX_K])
def test_both_kernels_give_the_same_int32_bytes(K):
    rng = np.random.default_rng(K)
    M, N = 5, 7
    a = rng.integers(-128, 128, (M, K), dtype=np.int8)
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    a[0], b[:, 0] = -128, -128  # the largest products, summed K times: the float32 bound at K = 1024
    a[1], b[:, 1] = 127, -128
    want = a.astype(np.int64) @ b.astype(np.int64)
    got_int, got_f32 = int8mm.mm_int(a, b), int8mm.mm_f32(a, b)
    assert got_int.dtype == got_f32.dtype == np.int32
    assert np.array_equal(got_int, want) and got_int.tobytes() == got_f32.tobytes()
    out = np.empty((M, N), np.int32)
    assert int8mm.mm_f32(a, b, out) is out and out.tobytes() == got_int.tobytes()


def test_a_float32_gemm_over_an_unchunked_k_past_1024_would_not_be_exact():
    """Why the chunks: 1025 products of -128 x -128 pass 2**24, where float32 stops holding
    every integer (the check that the bound above is the real one)."""
    import torch

    K = MAX_K_FLOAT32 + 1
    a = np.full((2, K), -128, np.int8)
    b = np.full((K, 2), -128, np.int8)
    a[:, 0], b[0, :] = 1, 1  # 1 + 1024 * 2**14 = 2**24 + 1: no float32 holds it, in any order
    exact = int((a.astype(np.int64) @ b.astype(np.int64))[0, 0])
    whole = (torch.from_numpy(a).float() @ torch.from_numpy(b).float()).to(torch.int64).numpy()
    assert exact == 2**24 + 1 and int(whole[0, 0]) != exact
    assert int(int8mm.mm_f32(a, b)[0, 0]) == exact == int(int8mm.mm_int(a, b)[0, 0])


STEP = r"""
import hashlib, sys
from daisychain.cli import build_parser
from daisychain.engine.settings import settings_from_args
from daisychain.engine.local import make_trainer
from daisychain.engine import int8mm
from daisychain.units import load_luts
rs = settings_from_args(build_parser().parse_args(["train", "--task", "image", "--steps", "2", "--batch", "32"]))
tr = make_trainer(rs.spec, rs.hp, rs.ds, load_luts(), "fast", 1)
h = hashlib.sha256()
for step in range(2):
    g = tr.contribute(list(range(tr.n_tasks))).grad
    h.update(g.tobytes())
    tr.apply(g)
print(int8mm.kernel(), h.hexdigest())
"""


def test_each_kernel_trains_the_same_image_steps():
    outs = {}
    for k in int8mm.KERNELS:
        env = {**os.environ, "DAISY_INT8_GEMM": k}
        r = subprocess.run([sys.executable, "-c", STEP], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        kern, digest = r.stdout.split()
        outs[kern] = digest
    assert set(outs) == set(int8mm.KERNELS) and len(set(outs.values())) == 1, outs

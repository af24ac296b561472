"""JS units, JS GEMMs and WGSL kernels against the numpy reference, bit for bit, on random
inputs and random shapes (including transposed operands), and their refusals."""

from __future__ import annotations

import numpy as np
import pytest
from browser_helpers import open_harness

from daisychain.units import gemm_lut, load_luts, mul, relu, requantize
from daisychain.units import reference as ref

pytestmark = pytest.mark.browser

PATHS = ("gpu", "wasm", "cpu", "cpu-lut")

CALL = """
async ([path, op, args]) => {
  const u = window.__units.paths[path];
  try {
    let out;
    if (op === 'gemm') out = await u.gemm(Int8Array.from(args.a), Int8Array.from(args.b), args.desc);
    else if (op === 'gemm-raw') out = await u.gemm(args.a, args.b, args.desc);
    else if (op === 'requantize') out = await u.requantize(Int32Array.from(args.acc), args.shift, { relu: args.relu });
    else if (op === 'requantize-raw') out = await u.requantize(args.acc, args.shift);
    else if (op === 'mul') out = await u.mul(args.a, args.b);
    else if (op === 'relu') out = await u.relu(args.x);
    return { out: Array.from(out) };
  } catch (err) {
    return { error: err.name + ': ' + err.message };
  }
}
"""


@pytest.fixture(scope="module")
def harness(browser_webgpu, server_url):
    page, info = open_harness(browser_webgpu, server_url)
    assert info["paths"] == ["cpu", "cpu-lut", "gpu", "wasm"], (info["gpuReason"], info["wasmReason"])
    yield page
    page.close()


def call(page, path, op, **args):
    return page.evaluate(CALL, [path, op, args])


@pytest.mark.parametrize("path", PATHS)
def test_random_gemms_all_layouts_match_numpy(harness, path):
    rng = np.random.default_rng(7)
    luts = load_luts()
    for trial in range(12):
        m, k, n = (int(x) for x in rng.integers(1, 40, 3))
        if trial == 0:
            m, k, n = 17, 300, 33  # K spans many 16-wide tiles, nothing a multiple of 16
        ta, tb = bool(trial & 1), bool(trial & 2)
        a = rng.integers(-128, 128, (m, k))
        b = rng.integers(-128, 128, (k, n))
        want = gemm_lut(a, b, luts)
        sa = a.T if ta else a
        sb = b.T if tb else b
        got = call(harness, path, "gemm", a=sa.ravel().tolist(), b=sb.ravel().tolist(),
                   desc={"m": m, "k": k, "n": n, "transA": ta, "transB": tb})
        assert "error" not in got, got
        np.testing.assert_array_equal(np.array(got["out"]).reshape(m, n), want,
                                      err_msg=f"{path} {m}x{k}x{n} transA={ta} transB={tb}")


@pytest.mark.parametrize("path", PATHS)
def test_random_elementwise_units_match_numpy(harness, path):
    rng = np.random.default_rng(11)
    luts = load_luts()
    a = rng.integers(-128, 128, 5000)
    b = rng.integers(-128, 128, 5000)
    assert call(harness, path, "mul", a=a.tolist(), b=b.tolist())["out"] == mul(a, b, luts).tolist()
    x = np.arange(-128, 128)
    assert call(harness, path, "relu", x=x.tolist())["out"] == relu(x, luts).tolist()
    for shift in (0, 1, 6, 7, 8, 13, 24, 31):
        acc = rng.integers(ref.INT32_MIN, ref.INT32_MAX, 3000, endpoint=True)
        acc[:4] = [ref.INT32_MIN, ref.INT32_MAX, 0, -1]
        for with_relu in (False, True):
            got = call(harness, path, "requantize", acc=acc.tolist(), shift=shift, relu=with_relu)
            want = requantize(acc, shift, luts).astype(np.int64)
            if with_relu:
                want = relu(want, luts)
            assert got["out"] == want.tolist(), (path, shift, with_relu)


@pytest.mark.parametrize("path", PATHS)
def test_out_of_range_operands_and_overflowing_shapes_are_refused(harness, path):
    cases = [
        ("mul", {"a": [128], "b": [0]}, "mul: a[0] must be an integer in [-128, 127]"),
        ("mul", {"a": [0.5], "b": [0]}, "mul: a[0]"),
        ("relu", {"x": [-129]}, "relu: x[0]"),
        ("requantize-raw", {"acc": [2**31], "shift": 3}, "requantize: acc[0]"),
        ("requantize-raw", {"acc": [1], "shift": 32}, "requantize: shift must be an integer in [0, 31]"),
        ("requantize-raw", {"acc": [1], "shift": -1}, "requantize: shift"),
        ("gemm-raw", {"a": [200], "b": [1], "desc": {"m": 1, "k": 1, "n": 1}}, "gemm: A[0]"),
        ("gemm-raw", {"a": [1, 2], "b": [1], "desc": {"m": 1, "k": 1, "n": 1}}, "gemm: A has 2"),
        ("gemm-raw", {"a": [], "b": [], "desc": {"m": 1, "k": 131072, "n": 1}},
         "gemm: K = 131072 could overflow the int32 accumulator"),
        ("gemm-raw", {"a": [], "b": [], "desc": {"m": 0, "k": 1, "n": 1}}, "gemm: m, k, n must be positive"),
    ]
    for op, args, message in cases:
        got = call(harness, path, op, **args)
        assert "error" in got, (op, args, got)
        assert got["error"].startswith("UnitError: ") and message in got["error"], got["error"]
    # a refusal leaves the GPU path usable
    assert call(harness, path, "mul", a=[3], b=[-5]) == {"out": [-15]}

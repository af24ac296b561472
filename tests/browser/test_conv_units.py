"""The image units (webui/units/conv.js and shaders/{im2col,col2im,maxpool,maxpool_back}.wgsl)
against numpy definitions written here straight from the conv spec (padding, windows and
numpy's first-occurrence argmax for the pool's tie rule), bit for bit, on random shapes with
odd sizes and many ties; their refusals; and one conv model's micro-batch gradient, the same
integers on the WebGPU, fast-GEMM and table-GEMM paths."""

from __future__ import annotations

import numpy as np
import pytest
from browser_helpers import open_harness, run_selftest
from numpy.lib.stride_tricks import sliding_window_view

pytestmark = pytest.mark.browser

PATHS = ("gpu", "wasm", "cpu", "cpu-lut")

CALL = """
async ([path, op, args]) => {
  const u = window.__units.paths[path];
  const arr = (x) => Float64Array.from(x); // any Numbers, so a non-integer reaches the unit
  try {
    let out;
    if (op === 'im2col') out = await u.im2col(arr(args.a), args.b, args.geom);
    else if (op === 'col2im') out = await u.col2im(arr(args.d), args.b, args.geom);
    else if (op === 'maxpool') out = await u.maxpool(arr(args.a), args.b, args.geom);
    else if (op === 'maxpoolBack') out = await u.maxpoolBack(arr(args.g), arr(args.a), args.b, args.geom);
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


def np_im2col(a, b, ci, k, h, w):
    p = (k - 1) // 2
    ap = np.pad(a.reshape(b, ci, h, w), ((0, 0), (0, 0), (p, p), (p, p)))
    win = sliding_window_view(ap, (k, k), axis=(2, 3))  # (b, ci, h, w, k, k)
    return win.transpose(0, 2, 3, 1, 4, 5).reshape(b * h * w, ci * k * k)


def np_col2im(d, b, ci, k, h, w):
    p = (k - 1) // 2
    d6 = d.reshape(b, h, w, ci, k, k)
    out = np.zeros((b, ci, h + 2 * p, w + 2 * p), np.int64)
    for dy in range(k):
        for dx in range(k):
            out[:, :, dy:dy + h, dx:dx + w] += d6[:, :, :, :, dy, dx].transpose(0, 3, 1, 2)
    return out[:, :, p:p + h, p:p + w].reshape(b, -1)


def _windows(a, b, c, h, w):
    oh, ow = h // 2, w // 2
    x = a.reshape(b, c, h, w)[:, :, :2 * oh, :2 * ow].reshape(b, c, oh, 2, ow, 2)
    return x.transpose(0, 1, 2, 4, 3, 5).reshape(b, c, oh, ow, 4)  # window order (0,0),(0,1),(1,0),(1,1)


def np_maxpool(a, b, c, h, w):
    return _windows(a, b, c, h, w).max(axis=-1).reshape(b, -1)


def np_maxpool_back(g, a, b, c, h, w):
    oh, ow = h // 2, w // 2
    first = _windows(a, b, c, h, w).argmax(axis=-1)  # numpy: the first maximum
    win = np.zeros((b, c, oh, ow, 4), np.int64)
    np.put_along_axis(win, first[..., None], g.reshape(b, c, oh, ow, 1), axis=-1)
    full = np.zeros((b, c, h, w), np.int64)
    full[:, :, :2 * oh, :2 * ow] = win.reshape(b, c, oh, ow, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(b, c, 2 * oh, 2 * ow)
    return full.reshape(b, -1)


SHAPES = [(1, 1, 3, 1, 1), (2, 3, 3, 5, 7), (3, 2, 5, 6, 4), (1, 4, 1, 3, 3), (2, 1, 5, 9, 8), (1, 2, 3, 28, 28)]


@pytest.mark.parametrize("path", PATHS)
def test_im2col_and_col2im_match_numpy(harness, path):
    rng = np.random.default_rng(3)
    for b, ci, k, h, w in SHAPES:
        geom = {"ci": ci, "k": k, "h": h, "w": w}
        a = rng.integers(-128, 128, b * ci * h * w)
        got = call(harness, path, "im2col", a=a.tolist(), b=b, geom=geom)
        assert got.get("out") == np_im2col(a, b, ci, k, h, w).ravel().tolist(), (path, b, ci, k, h, w, got.get("error"))
        bound = (2**31 - 1) // (k * k)
        d = rng.integers(-bound, bound + 1, b * h * w * ci * k * k)
        d[: min(5, d.size)] = bound  # extremes: the sums reach k*k*bound without leaving int32
        got = call(harness, path, "col2im", d=d.tolist(), b=b, geom=geom)
        assert got.get("out") == np_col2im(d, b, ci, k, h, w).ravel().tolist(), (path, b, ci, k, h, w, got.get("error"))


@pytest.mark.parametrize("path", PATHS)
def test_maxpool_and_its_backward_match_numpy_with_ties(harness, path):
    rng = np.random.default_rng(4)
    for b, c, h, w, lo, hi in [(2, 3, 4, 4, -2, 3), (1, 2, 5, 7, -1, 2), (3, 1, 2, 2, 0, 1), (2, 4, 9, 6, -128, 128),
                               (1, 16, 28, 28, -3, 4)]:
        geom = {"c": c, "h": h, "w": w}
        a = rng.integers(lo, hi, b * c * h * w)
        got = call(harness, path, "maxpool", a=a.tolist(), b=b, geom=geom)
        assert got.get("out") == np_maxpool(a, b, c, h, w).ravel().tolist(), (path, b, c, h, w, got.get("error"))
        g = rng.integers(-127, 128, b * c * (h // 2) * (w // 2))
        got = call(harness, path, "maxpoolBack", g=g.tolist(), a=a.tolist(), b=b, geom=geom)
        assert got.get("out") == np_maxpool_back(g, a, b, c, h, w).ravel().tolist(), (path, b, c, h, w, got.get("error"))


@pytest.mark.parametrize("path", PATHS)
def test_pool_tie_rule_is_the_first_maximum_in_row_major_order(harness, path):
    """Window [[5, 5], [5, 5]] -> (0,0); [[1, 7], [7, 7]] -> (0,1); [[0, 0], [3, 3]] -> (1,0)."""
    a = [5, 5, 1, 7, 0, 0,
         5, 5, 7, 7, 3, 3]
    got = call(harness, path, "maxpoolBack", g=[11, 22, 33], a=a, b=1, geom={"c": 1, "h": 2, "w": 6})
    assert got.get("out") == [11, 0, 0, 22, 0, 0,
                              0, 0, 0, 0, 33, 0], got


@pytest.mark.parametrize("path", PATHS)
def test_image_units_refuse_bad_operands(harness, path):
    cases = [
        ("im2col", dict(a=[0] * 8, b=1, geom={"ci": 1, "k": 3, "h": 3, "w": 3}), "the shape needs 9"),
        ("im2col", dict(a=[0] * 8 + [128], b=1, geom={"ci": 1, "k": 3, "h": 3, "w": 3}), "must be an integer in [-128, 127]"),
        ("im2col", dict(a=[0] * 4, b=1, geom={"ci": 1, "k": 2, "h": 2, "w": 2}), "must be odd"),
        ("col2im", dict(d=[0] * 8, b=1, geom={"ci": 1, "k": 3, "h": 1, "w": 1}), "the shape needs 9"),
        ("col2im", dict(d=[0.5] + [0] * 8, b=1, geom={"ci": 1, "k": 3, "h": 1, "w": 1}), "must be an integer"),
        ("maxpool", dict(a=[0] * 3, b=1, geom={"c": 1, "h": 1, "w": 3}), "at least 2x2"),
        ("maxpool", dict(a=[0, 0, 0, -129], b=1, geom={"c": 1, "h": 2, "w": 2}), "must be an integer in [-128, 127]"),
        ("maxpoolBack", dict(g=[0, 0], a=[0] * 4, b=1, geom={"c": 1, "h": 2, "w": 2}), "the shape needs"),
    ]
    for op, args, words in cases:
        got = call(harness, path, op, **args)
        assert "error" in got and "UnitError" in got["error"] and words in got["error"], (op, got)


GRAD = """
async ([path, layers, c, h, w, b, seed]) => {
  const { Engine, initParams } = await import('/webui/engine/model.js');
  const S = await import('/webui/engine/spec.js');
  const spec = S.imageCnn(c, h, w, S.parseLayers(layers), 10);
  const eng = new Engine(spec, window.__units.paths[path]);
  const theta = initParams(spec, seed);
  let r = seed * 7919 + 1;
  const rnd = () => { r = (Math.imul(r, 1103515245) + 12345) >>> 0; return r >>> 24; };
  const x = Uint8Array.from({ length: b * c * h * w }, rnd);
  const y = Int32Array.from({ length: b }, () => rnd() % 10);
  const total = new Float64Array(theta.length);
  const trace = [];
  await eng.forward(theta, x, b, (name, v) => trace.push([name, Array.from(v)]));
  const res = await eng.gradInto(total, theta, x, y, b, 40, 2 ** 49);
  return { total: Array.from(total), trace, loss: res.loss, model: spec.toJson() };
}
"""


@pytest.mark.parametrize("layers, c, h, w", [("conv4,pool,conv8k5,pool", 1, 8, 8), ("conv6,conv5k5,pool,12", 3, 7, 9)])
def test_conv_model_gradient_is_the_same_on_every_path(harness, layers, c, h, w):
    got = {p: harness.evaluate(GRAD, [p, layers, c, h, w, 4, 2]) for p in PATHS}
    ref = got["cpu"]
    assert any(v != 0 for v in ref["total"]) and len(ref["total"]) > 0
    assert [t[0] for t in ref["trace"]][:2] == ["input_exponent", "input_q"]
    for p in ("gpu", "wasm", "cpu-lut"):
        assert got[p]["trace"] == ref["trace"], p
        assert got[p]["total"] == ref["total"], p


def test_selftest_checks_the_image_kernels_on_every_path(gpu_page, server_url):
    result = run_selftest(gpu_page, f"{server_url}/selftest")
    assert result["error"] is None, result["error"]
    for path in ("gpu", "wasm", "cpu", "cpu-lut"):
        image = result["paths"][path]["sets"]["image"]
        assert image["pass"] and len(image["cases"]) == 8, (path, image)
    assert result["usable_paths"] == ["gpu", "wasm", "cpu", "cpu-lut"]


def test_a_pool_kernel_with_another_tie_rule_fails_the_selftest_and_gpu_is_disabled(gpu_page, server_url):
    """A maxpool_back.wgsl that gives the error to the LAST maximum of a window (>= for >)
    trains other bits: the self-test's image cases catch it before the tab trains."""
    def last_max(route):
        src = route.fetch().body().decode()
        assert src.count("] > a[best]") == 3
        route.fulfill(body=src.replace("] > a[best]", "] >= a[best]"), content_type="text/plain")
    gpu_page.route("**/shaders/maxpool_back.wgsl", last_max)
    result = run_selftest(gpu_page, f"{server_url}/selftest")
    assert result["error"] is None
    gpu = result["paths"]["gpu"]
    assert gpu["tried"] and not gpu["pass"]
    assert "failed golden vectors: image maxpoolBack" in gpu["disabled"], gpu["disabled"]
    assert result["usable_paths"] == ["wasm", "cpu", "cpu-lut"]


BIG = """
async ([b, ci, k, h, w]) => {
  const { gpu, cpu } = window.__units.paths;
  let s = 99;
  const rnd = (lo, hi) => { s = (Math.imul(s, 1103515245) + 12345) >>> 0; return lo + (s >>> 8) % (hi - lo); };
  const g = { ci, k, h, w };
  const a = Int32Array.from({ length: b * ci * h * w }, () => rnd(-128, 128));
  const same = (x, y) => x.length === y.length && x.every((v, i) => v === y[i]);
  const c1 = await gpu.im2col(a, b, g);
  const c0 = await cpu.im2col(a, b, g);
  const d = Int32Array.from({ length: c0.length }, () => rnd(-50000, 50000));
  return { n: c0.length, groups: gpu.limits.maxComputeWorkgroupsPerDimension,
           im2col: same(c1, c0), col2im: same(await gpu.col2im(d, b, g), await cpu.col2im(d, b, g)) };
}
"""


def test_image_kernels_past_one_dispatch_dimension(harness):
    """More than 65,535 workgroups of 64: the kernels take the second dispatch dimension."""
    got = harness.evaluate(BIG, [16, 16, 5, 28, 28])
    assert got["n"] > 64 * got["groups"], got
    assert got["im2col"] and got["col2im"], got

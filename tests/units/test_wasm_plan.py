"""Unit tier (node): a whole micro-batch kept in the WebAssembly module's memory
(webui/wasm/wasm_plan.js, the kernels of units.wat and units.plan.wat) gives the Python
engine's contribution, bit for bit, on shared data: the SHA-256 of the fixed-point gradient
of the module's very first calls (a fresh instance that ran nothing, no self-check before: the
code V8's baseline compiler made) and of a call after many (the optimised code), for the
default CNN on a micro-batch of 16, a CNN with a conv on a conv, a 5x5 kernel, odd maps and a
hidden linear layer, the same with the mse loss, a linear right on a conv's map, and an MLP. A model the plan does not cover
runs the units one by one; a module whose plan kernels compute wrong is refused by its
self-check at open, with the reason in words."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from daisychain import package_path
from daisychain.engine.model import Engine, init_params
from daisychain.engine.spec import DEFAULT_CNN, ModelSpec, char_mlp, cnn, mlp
from daisychain.units import load_luts
from test_wasm_units import ROOT, WASM, run_wasm

pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node

FRAC, LIMIT = 40, 2.0**49

COLD = r"""
const { createHash } = await import("node:crypto");
const out = [];
for (const job of DATA) {
  // a fresh instance of the module: none of its functions has run in this process's code
  // for this instance, and nothing warmed it (no self-check)
  const { module, instance } = await WebAssembly.instantiate(wasmBytes, {});
  const units = new W.WasmUnits(luts, instance, module);
  const spec = S.ModelSpec.fromJson(job.model);
  const theta = initParams(spec, job.seed);
  const x = job.image ? Uint8Array.from(Buffer.from(job.x, "hex")) : Float64Array.from(job.x);
  const y = job.mse ? Float64Array.from(job.y) : Int32Array.from(job.y);
  const sha = async () => {
    const total = new Float64Array(theta.length);
    await new Engine(spec, units).gradInto(total, theta, x, y, job.b, job.frac, job.limit);
    return createHash("sha256").update(new Uint8Array(total.buffer)).digest("hex");
  };
  const first = await sha();
  for (let i = 0; i < job.warm; i++) await sha();
  out.push({ first, warm: await sha(), plan: !!(await units.residentPlan(spec, job.b)) });
}
console.log(JSON.stringify(out));
"""


def _job(spec, b, seed, rng, mse=False, warm=30, nonzero=0.3):
    eng = Engine(spec, load_luts())
    theta = init_params(spec, seed)
    if spec.input_kind == "image":
        x = rng.integers(0, 256, (1, b, spec.input_dim)).astype(np.uint8)
        jx = x.tobytes().hex()
    else:
        x = rng.integers(-20, 21, (1, b, spec.input_dim)).astype(np.float64)
        jx = x.ravel().tolist()
    y = rng.normal(size=(1, b, spec.classes)) if mse else rng.integers(0, spec.classes, (1, b))
    want = eng.grad(theta, x, y, FRAC, LIMIT).grad
    assert np.count_nonzero(want) > nonzero * want.size  # the check below could fail
    return ({"model": spec.to_json(), "seed": seed, "b": b, "x": jx, "image": spec.input_kind == "image",
             "mse": mse, "y": y.ravel().tolist(), "frac": FRAC, "limit": LIMIT, "warm": warm},
            hashlib.sha256(want.astype("<f8").tobytes()).hexdigest())


def test_a_micro_batch_in_the_modules_memory_gives_the_python_engines_contribution():
    rng = np.random.default_rng(33)
    small = cnn((1, 10, 8), ["conv3", "conv4k5", "pool", "conv5", "pool", 6], 3)
    mse_spec = ModelSpec.from_json({**small.to_json(), "loss": "mse"})
    cases = [_job(cnn((1, 28, 28), DEFAULT_CNN, 10), 16, 1, rng, warm=20),
             _job(small, 3, 2, rng),
             _job(mse_spec, 5, 3, rng, mse=True),
             _job(cnn((1, 6, 5), ["conv2k5", 4], 3), 4, 5, rng),  # a linear right on a conv's map
             _job(mlp(64, 128, 10), 16, 4, rng),
             # a 5x5 and a 3x3 conv on a 2x1 map (col2im8t: columns outside a map narrower than p)
             _job(cnn((2, 4, 2), ["conv3", "pool", "conv4k5", "conv3", 5], 3), 3, 6, np.random.default_rng(6), nonzero=0.15)]
    got = run_wasm(COLD, data=[job for job, _ in cases],
                   imports={"S": "engine/spec.js", "{ Engine, initParams }": "engine/model.js"}, timeout=300)
    for (job, want), have in zip(cases, got):
        assert have["plan"], job["model"]["layers"]
        assert have["first"] == want, ("the first, cold calls", job["model"]["layers"])
        assert have["warm"] == want, ("after warm-up", job["model"]["layers"])


def test_a_model_the_plan_does_not_cover_runs_the_units_one_by_one():
    got = run_wasm("""
const spec = S.ModelSpec.fromJson(DATA);
const theta = initParams(spec, 1);
const x = Int32Array.from({ length: 4 * spec.inputDim }, (_, i) => (i * 7) % 5);
const y = Int32Array.from({ length: 4 }, (_, i) => i % 5);
const sums = [];
for (const u of [wasm, new P.CpuUnits(luts)]) {
  const total = new Float64Array(theta.length);
  await new Engine(spec, u).gradInto(total, theta, x, y, 4, 40, 2 ** 49);
  sums.push(Array.from(total));
}
console.log(JSON.stringify({ plan: await wasm.residentPlan(spec, 4), why: WP.planUnsupported(spec, 4),
  same: sums[0].every((v, i) => v === sums[1][i]) }));
""", data=char_mlp(5, 3, 4, 6).to_json(),
        imports={"S": "engine/spec.js", "{ Engine, initParams }": "engine/model.js", "WP": "wasm/wasm_plan.js"})
    assert got == {"plan": None, "why": "a tokens model", "same": True}


def test_a_module_whose_plan_kernels_compute_wrong_is_refused_at_open():
    """The bias sums (sum_blocks) off by one in a module that passes every unit's check: the
    plan's self-check at open finds it, and the tab computes on the JS units, saying why."""
    head = (WASM / "units.wat").read_text().rstrip()
    plan = "\n".join(f.read_text() for f in sorted(WASM.glob("units.*.wat")))  # every fragment, in name order
    bad_plan = plan.replace("(i32.store (local.get $o) (i32.add (i32.load (local.get $o)) (local.get $t)))",
                            "(i32.store (local.get $o) (i32.add (i32.load (local.get $o)) (i32.add (local.get $t) (i32.const 1))))", 1)
    assert bad_plan != plan
    got = run_wasm("""
const wabt = await wabtInit();
const out = [];
for (const text of [DATA.good, DATA.bad]) {
  const mod = wabt.parseWat("units.wat", text, { simd: true });
  const r = await W.openWasmUnits(luts, { bytes: Uint8Array.from(mod.toBinary({}).buffer) });
  out.push([r.units === null, r.reason]);
}
console.log(JSON.stringify(out));
""", data={"good": f"{head[:-1]}\n{plan})\n", "bad": f"{head[:-1]}\n{bad_plan})\n"},
        imports={"{ default as wabtInit }": ROOT / "node_modules" / "wabt" / "index.js"})
    assert got[0] == [False, None]
    assert got[1][0]
    assert got[1][1].startswith("the WebAssembly SIMD module failed its self-check (the micro-batch of a small CNN: parameter ")


def test_the_fragment_is_part_of_the_pinned_module():
    """units.wasm is units.wat with units.op.wat and units.plan.wat inserted (scripts/build_wasm.mjs): its
    exports include the plan's kernels."""
    got = run_wasm("""
console.log(JSON.stringify(WebAssembly.Module.exports(new WebAssembly.Module(wasmBytes)).map((e) => e.name)));
""")
    assert {"gemm", "im2col", "bias_rows", "pad8", "cols8", "col2im8t", "narrow", "sum_blocks", "transpose", "mask", "gemm_op",
            "narrow_il", "il8", "accum", "quant", "absmax64", "same"} <= set(got)
    assert package_path("webui") / "wasm" == WASM


OUTER = r"""
const { instance } = await WebAssembly.instantiate(wasmBytes, {});
const { memory, gemm_op: gemmOp, narrow_il: narrowIl } = instance.exports;
memory.grow(64);
const out = [];
for (const c of DATA.cases) {
  const { m, n, k, hw, lda } = c; // B's columns j = s*hw + p of b = n / hw channel-major maps (k, hw)
  const kh = Math.ceil(k / 2);
  const mem = () => new Uint8Array(memory.buffer);
  mem().fill(0);
  const [pa, psrc, pb, pc] = [0, 16384, 65536, 131072];
  new Int8Array(memory.buffer, pa, m * lda).set(Int8Array.from(c.a)); // A (m, lda) int8
  new Int32Array(memory.buffer, psrc, n * k).set(Int32Array.from(c.src)); // (n / hw, k, hw) int32
  const bad = narrowIl(psrc, pb, n / hw, k, hw, kh);
  gemmOp(pa, lda, pb, pc, m, up8(n), kh);
  out.push({ bad, c: Array.from(new Int32Array(memory.buffer, pc, m * up8(n))) });
}
function up8(x) { return Math.ceil(x / 8) * 8; }
const src = new Int32Array(memory.buffer, 16384, 8);
src.set([5, DATA.outside, 0, 0, 0, 0, 0, 0]);
out.push({ bad: narrowIl(16384, 65536, 1, 2, 1, 1) }); // one value at a time
out.push({ bad: narrowIl(16384, 65536, 1, 2, 4, 1) }); // 4 positions a step
console.log(JSON.stringify(out));
"""


@pytest.mark.parametrize("hw", [1, 4, 6, 8])
def test_the_outer_product_gemm_equals_numpy_at_every_k(hw):
    """gemm_op on B laid out by narrow_il (units.op.wat) is A·Bᵀ exactly, for every short K
    (odd ones: the pair's second value is padding), -128·-128 sums at the edge, B from a
    channel-major map (hw > 1; 4 and 8: narrow_il's 4 positions a step) or a weight matrix
    (hw = 1); a value outside int8 is refused on both of narrow_il's paths."""
    rng = np.random.default_rng(hw)
    cases, want = [], []
    for m, n, k in [(4, 8, 1), (8, 16, 9), (4, 24, 16), (12, 48, 31), (8, 8, 64), (4, 72, 33)]:
        n = max(hw, n // hw * hw)  # whole maps; with hw = 6 some n are not multiples of 8
        lda = -(-k // 8) * 8
        a = rng.integers(-128, 128, (m, k))
        bm = rng.integers(-128, 128, (n, k))  # B (n, k): column j = s*hw + p, K = channel o
        a[0, :] = -128
        bm[0, :] = -128
        ap = np.zeros((m, lda), np.int64)
        ap[:, :k] = a
        if k % 2:
            ap[:, k] = rng.integers(-128, 128, m)  # what a padded row holds past K: B's zeros meet it
        src = bm.reshape(n // hw, hw, k).transpose(0, 2, 1)  # channel-major (s, o, p)
        cases.append({"m": m, "n": n, "k": k, "hw": hw, "lda": lda,
                      "a": ap.ravel().tolist(), "src": src.ravel().tolist()})
        c = np.zeros((m, -(-n // 8) * 8), np.int64)
        c[:, :n] = a @ bm.T
        want.append(c.ravel().tolist())
    got = run_wasm(OUTER, data={"cases": cases, "outside": 128})
    for case, w, g in zip(cases, want, got):
        assert g["bad"] == 0, case["k"]
        assert g["c"] == w, (case["m"], case["n"], case["k"])
    assert got[-2:] == [{"bad": 1}, {"bad": 1}]


NARROW = r"""
const { instance } = await WebAssembly.instantiate(wasmBytes, {});
const { memory, narrow } = instance.exports;
memory.grow(16);
const out = [];
for (const c of DATA) {
  new Uint8Array(memory.buffer).fill(0x55);
  new Int32Array(memory.buffer, 0, c.src.length).set(Int32Array.from(c.src));
  const bad = narrow(0, 262144, c.b, c.r, c.c, c.bs, c.is, c.js);
  out.push({ bad, bytes: Array.from(new Int8Array(memory.buffer, 262144, c.span)) });
}
console.log(JSON.stringify(out));
"""


def test_narrow_sixteen_bytes_a_step_writes_exactly_its_bytes():
    """narrow (units.plan.wat) writes contiguous rows 16 bytes a step and the rest one at a
    time: for rows of 1-49 values, contiguous (js = 1) or strided, every byte it should write
    holds its value and no other byte changes (a plan's zero padding meets the other GEMM
    operand's garbage); a value outside int8 in a 16-byte step or in the tail is refused."""
    rng = np.random.default_rng(5)
    cases, want = [], []
    for b, r, c, js in [(2, 3, 1, 1), (1, 2, 15, 1), (3, 2, 16, 1), (2, 2, 17, 1), (1, 3, 33, 1), (2, 1, 49, 1),
                        (2, 3, 5, 7), (1, 2, 20, 3)]:
        src = rng.integers(-128, 128, (b, r, c))
        is_ = c * js + 9 if js == 1 else 1
        bs = r * is_ + 5 if js == 1 else r * c * js + 3
        span = b * bs + 32
        mem = np.full(span, 0x55, np.int64)
        for s in range(b):
            for i in range(r):
                for j in range(c):
                    mem[s * bs + i * is_ + j * js] = src[s, i, j]
        cases.append({"src": src.ravel().tolist(), "b": b, "r": r, "c": c, "bs": bs, "is": is_, "js": js,
                      "span": span})
        want.append(((mem + 128) % 256 - 128).tolist())
    for pos, v in [(3, 128), (16, -129)]:  # in a 16-byte step; in the tail
        src = np.zeros((1, 1, 17), np.int64)
        src[0, 0, pos] = v
        cases.append({"src": src.ravel().tolist(), "b": 1, "r": 1, "c": 17, "bs": 32, "is": 32, "js": 1, "span": 1})
    got = run_wasm(NARROW, data=cases)
    for case, w, g in zip(cases, want, got):
        assert g == {"bad": 0, "bytes": w}, (case["b"], case["r"], case["c"], case["js"])
    assert [g["bad"] for g in got[-2:]] == [1, 1]


def test_transpose_by_four_by_four_tiles_equals_numpy():
    """transpose (units.plan.wat) moves 4 x 4 tiles and the rest one value at a time: for
    blocks of 1-9 rows and columns, b of them, every value lands at its transposed place and
    the bytes after the last block do not change."""
    rng = np.random.default_rng(6)
    cases, want = [], []
    for b, r, c in [(1, 1, 1), (2, 4, 4), (1, 5, 3), (3, 4, 9), (2, 9, 8), (1, 7, 6), (2, 49, 16), (1, 8, 12)]:
        src = rng.integers(-2**31, 2**31, (b, r, c))
        cases.append({"b": b, "r": r, "c": c, "src": src.ravel().tolist()})
        want.append(src.transpose(0, 2, 1).ravel().tolist() + [0x55555555] * 4)
    got = run_wasm(r"""
const { instance } = await WebAssembly.instantiate(wasmBytes, {});
const { memory, transpose } = instance.exports;
memory.grow(4);
const out = [];
for (const c of DATA) {
  new Uint8Array(memory.buffer).fill(0x55);
  new Int32Array(memory.buffer, 0, c.src.length).set(Int32Array.from(c.src));
  transpose(0, 65536, c.b, c.r, c.c);
  out.push(Array.from(new Int32Array(memory.buffer, 65536, c.src.length + 4)));
}
console.log(JSON.stringify(out));
""", data=cases)
    for case, w, g in zip(cases, want, got):
        assert g == w, (case["b"], case["r"], case["c"])


def test_the_fixed_point_sum_in_the_module_equals_layers_js_accumulate():
    """accum (units.sum.wat) adds clamp-then-round(int32 * 2^(e + S)) into a float64 total
    with layers.js accumulate's operations: rows of 1-9 values read with a row stride, halves
    rounded up (-2.5 -> -2, 2.5 -> 3), values clamped at the limit, int32's ends; the same
    float64 bits as accumulate on every value."""
    got = run_wasm(r"""
const { accumulate } = await import(new URL("engine/layers.js", WEBUI));
const { pow2 } = await import(new URL("engine/detmath.js", WEBUI));
const { instance } = await WebAssembly.instantiate(wasmBytes, {});
const { memory, accum } = instance.exports;
memory.grow(4);
let seed = 3;
const rnd = (n) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return (seed >>> 8) % n; };
const out = [];
for (const [rows, cols, ld, e, limit] of [[1, 1, 1, -1, 2 ** 49], [3, 5, 8, -1, 2 ** 49], [2, 9, 12, -3, 2 ** 49],
    [4, 4, 4, -40, 2 ** 49], [2, 7, 7, 0, 1000], [5, 3, 4, 2, 2 ** 20], [1, 16, 16, -41, 3]]) {
  const ints = Int32Array.from({ length: rows * ld }, () => rnd(11) - 5);
  ints[0] = -2147483648; ints[ints.length - 1] = 2147483647; // int32's ends
  if (ld > 2) { ints[1] = -5; ints[2] = 5; } // halves at e = -1
  const start = Float64Array.from({ length: rows * cols + 3 }, () => rnd(1000) - 500);
  const want = start.slice();
  for (let r = 0; r < rows; r++) accumulate(want, 1 + r * cols, ints.subarray(r * ld, r * ld + cols), e, 40, limit);
  new Int32Array(memory.buffer, 0, ints.length).set(ints);
  const got = new Float64Array(memory.buffer, 65536, start.length);
  got.set(start);
  accum(0, ld, rows, cols, 65536 + 8, pow2(e + 40), limit);
  out.push(got.every((v, i) => Object.is(v, want[i])) && want.some((v, i) => v !== start[i]));
}
console.log(JSON.stringify(out));
""")
    assert got == [True] * 7


def test_the_weights_quantize_in_the_module_equals_detmath_js():
    """absmax64 and quant (units.f64.wat) give detmath.js absmax and quantize's bits: n of
    1-11 values (a tail after the 4-value steps), halves of the scale rounded up, values
    clamped to ±127, -0, a NaN (absmax NaN, its quantized value 0)."""
    got = run_wasm(r"""
const D = await import(new URL("engine/detmath.js", WEBUI));
const { instance } = await WebAssembly.instantiate(wasmBytes, {});
const { memory, absmax64, quant } = instance.exports;
memory.grow(2);
let seed = 9;
const rnd = (n) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return (seed >>> 8) % n; };
const out = [];
for (const n of [1, 2, 3, 4, 5, 8, 11]) {
  for (const special of [null, -0, 2.5, -2.5, 1e9, NaN]) {
    const x = Float64Array.from({ length: n }, () => (rnd(2001) - 1000) / 64);
    if (special !== null) x[rnd(n)] = special;
    new Float64Array(memory.buffer, 8, n).set(x); // 8: float64s at an address not 16-aligned
    const m = absmax64(8, n);
    const want = D.absmax(x);
    const e = D.quantExponent(want);
    quant(8, 4096, n, D.pow2(-e));
    const q = new Int32Array(memory.buffer, 4096, n);
    const wq = D.quantize(x, e);
    out.push(Object.is(m, want) && q.every((v, i) => v === wq[i]));
  }
}
console.log(JSON.stringify(out));
""")
    assert got == [True] * 42


def test_a_plan_requantizes_whenever_one_parameter_changed():
    """The plan quantizes the weights again only when the parameters' bits changed (units.f64.wat
    same, against the module's copy of those last quantized): one plan given the parameters,
    then the same with only the first, only a middle or only the last value changed, then the
    first again, gives each time the JS units' contribution for those parameters; and same
    finds a difference in any byte of 40."""
    got = run_wasm(r"""
const spec = S.mlp(7, 9, 4);
const base = initParams(spec, 3);
const b = 5;
const x = Float64Array.from({ length: b * 7 }, (_, i) => (i * 13) % 9 - 4);
const y = Int32Array.from({ length: b }, (_, i) => i % 4);
const plan = await wasm.residentPlan(spec, b);
const cpu = new P.CpuUnits(luts);
const out = [];
for (const at of [null, 0, 40, base.length - 1, null]) {
  const theta = base.slice();
  if (at !== null) theta[at] = theta[at] * 3 + 0.25; // a change its layer's quantization sees
  const got = new Float64Array(theta.length);
  const want = new Float64Array(theta.length);
  await plan.gradInto(got, theta, x, y, 40, 2 ** 49);
  await new Engine(spec, cpu).gradInto(want, theta, x, y, b, 40, 2 ** 49);
  out.push(got.every((v, i) => v === want[i]));
}
const k = plan.k;
new Uint8Array(plan.mem.buffer, 0, 80).fill(7);
const diffs = [];
for (let i = 0; i < 40; i++) {
  const m = new Uint8Array(plan.mem.buffer, 40, 40);
  m[i] = 8;
  diffs.push(k.same(0, 40, 40));
  m[i] = 7;
}
console.log(JSON.stringify({ out, diffs, equal: k.same(0, 40, 40) }));
""", imports={"S": "engine/spec.js", "{ Engine, initParams }": "engine/model.js"})
    assert got == {"out": [True] * 5, "diffs": [0] * 40, "equal": 1}


def test_il8_lays_out_int8_rows_for_the_outer_product_gemm():
    """il8 (units.op.wat) interleaves int8 rows (K rows of ld bytes, n columns: a conv's
    columns for its weight gradient) for gemm_op: A·B equals numpy's product for odd and even
    K, n below, at and above 16, -128·-128 at the edge; the bytes past n it reads are garbage
    that only reaches C's columns past n."""
    rng = np.random.default_rng(8)
    cases, want = [], []
    for m, k, n in [(4, 1, 3), (4, 2, 16), (8, 7, 9), (4, 16, 17), (12, 31, 40), (4, 6, 144)]:
        ld = -(-n // 8) * 8
        a = rng.integers(-128, 128, (m, k))
        src = rng.integers(-128, 128, (k, ld))  # rows past n hold garbage, as cols8's do
        a[0, :] = -128
        src[:, 0] = -128
        kp = -(-k // 8) * 8
        ap = np.zeros((m, kp), np.int64)
        ap[:, :k] = a
        cases.append({"m": m, "k": k, "n": n, "ld": ld, "kp": kp, "a": ap.ravel().tolist(), "src": src.ravel().tolist()})
        want.append((a @ src[:, :n]).tolist())
    got = run_wasm(r"""
const { instance } = await WebAssembly.instantiate(wasmBytes, {});
const { memory, gemm_op: gemmOp, il8 } = instance.exports;
memory.grow(16);
const out = [];
for (const c of DATA) {
  new Uint8Array(memory.buffer).fill(0x5a); // garbage everywhere but the operands
  new Int8Array(memory.buffer, 0, c.a.length).set(Int8Array.from(c.a));
  new Int8Array(memory.buffer, 65536, c.src.length).set(Int8Array.from(c.src));
  const kh = Math.ceil(c.k / 2);
  il8(65536, c.ld, 131072, c.k, c.n, kh);
  const np = Math.ceil(c.n / 8) * 8;
  gemmOp(0, c.kp, 131072, 262144, c.m, np, kh);
  const C = new Int32Array(memory.buffer, 262144, c.m * np);
  out.push(Array.from({ length: c.m }, (_, i) => Array.from(C.subarray(i * np, i * np + c.n))));
}
console.log(JSON.stringify(out));
""", data=cases)
    for case, w, g in zip(cases, want, got):
        assert g == w, (case["m"], case["k"], case["n"])

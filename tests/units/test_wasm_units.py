"""Unit tier (node): the tab's WebAssembly SIMD kernels (webui/wasm/units.wat, WasmUnits)
against numpy and the JS units, bit for bit: the module is reproducible (two builds give the
same bytes, equal to the pinned SHA-256 and to the built file), the golden unit vectors pass
through it with the Python goldens' SHA-256, every GEMM layout equals numpy's int64 product on
random shapes, a whole micro-batch of the default CNN gives the JS units' contribution, and a
module that is not the pinned one, whose tables are not exact, or that computes wrong on its
first calls is never used, with the reason in words."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from daisychain import package_path
from jsrun import LOAD_LUTS, node_binary, run_js

pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node

ROOT = Path(__file__).resolve().parents[2]
WASM = package_path("webui") / "wasm"
BUILT = ("the WebAssembly module is not built: scripts/setup.sh runs npm install and "
         "node scripts/build_wasm.mjs")

LUTS = "const lutDir = process.argv[2];\n" + LOAD_LUTS + r"""
const wasmBytes = readFileSync(new URL("wasm/units.wasm", WEBUI));
const pinned = readFileSync(new URL("wasm/units.wasm.sha256", WEBUI), "utf8").trim();
const opened = await W.openWasmUnits(luts, { bytes: wasmBytes, pinned });
if (!opened.units) throw new Error(opened.reason);
const wasm = opened.units;
"""
IMPORTS = {"W": "wasm/wasm_units.js", "P": "engine/cpu_units.js"}


def run_wasm(body: str, data=None, imports=None, timeout: float = 120):
    assert (WASM / "units.wasm").is_file(), BUILT
    return run_js(LUTS + body, imports={**IMPORTS, **(imports or {})}, data=data, timeout=timeout,
                  args=[str(package_path("luts"))])


def assemble(wat: Path | None = None) -> bytes:
    """The module's bytes as scripts/build_wasm.mjs makes them (npm wabt), touching nothing."""
    assert (ROOT / "node_modules" / "wabt").is_dir(), BUILT
    proc = subprocess.run([node_binary(), str(ROOT / "scripts" / "build_wasm.mjs"), "--stdout", "units"],
                          capture_output=True, timeout=120, check=True)
    return proc.stdout


def test_module_is_reproducible_and_pinned():
    first, second = assemble(), assemble()
    assert first == second and len(first) > 1000
    pin = (WASM / "units.wasm.sha256").read_text().strip()
    assert hashlib.sha256(first).hexdigest() == pin
    assert (WASM / "units.wasm").read_bytes() == first, "units.wasm is stale: node scripts/build_wasm.mjs"


def test_golden_unit_vectors_through_wasm_match_the_python_goldens():
    golden = json.loads((package_path("golden") / "units.json").read_text())
    got = run_wasm("""
const g = await runGolden(wasm, DATA);
console.log(JSON.stringify({ pass: g.pass, failures: g.failures, sets: g.sets, name: wasm.name }));
""", data=golden, imports={"{ runGolden }": "engine/conformance.js"})
    assert got["name"] == "wasm"
    assert got["pass"], got["failures"]
    assert got["sets"], "no golden set ran"


def test_every_gemm_layout_equals_numpy():
    rng = np.random.default_rng(5)
    cases = []
    # K padded to 8, 16, 24 and 40: the kernel's one 8-value step alone, its 16-value steps
    # alone, and the 8-value step before them
    for m, k, n in [(1, 1, 1), (3, 5, 7), (17, 9, 33), (64, 144, 32), (31, 300, 6), (2, 8, 4),
                    (4, 24, 8), (7, 37, 13)]:
        for ta in (False, True):
            for tb in (False, True):
                a = rng.integers(-128, 128, (m, k))
                b = rng.integers(-128, 128, (k, n))
                cases.append({"m": m, "k": k, "n": n, "transA": ta, "transB": tb,
                              "a": (a.T if ta else a).ravel().tolist(), "b": (b.T if tb else b).ravel().tolist(),
                              "want": (a.astype(np.int64) @ b).ravel().tolist()})
    a = np.full((5, 4096), -128)
    cases.append({"m": 5, "k": 4096, "n": 5, "transA": False, "transB": True, "a": a.ravel().tolist(),
                  "b": a.ravel().tolist(), "want": (a.astype(np.int64) @ a.T).ravel().tolist()})
    got = run_wasm("""
const out = [];
for (const c of DATA) out.push(Array.from(await wasm.gemm(Int32Array.from(c.a), Int32Array.from(c.b), c)));
console.log(JSON.stringify(out));
""", data=cases)
    for c, have in zip(cases, got):
        assert have == c["want"], (c["m"], c["k"], c["n"], c["transA"], c["transB"])


def test_default_cnn_micro_batch_equals_the_js_units():
    """The whole contribution (forward, backward, fixed-point sum) of one micro-batch of 16 on
    the default CNN, and of a digits MLP, through WASM and through the JS units."""
    got = run_wasm("""
const out = {};
for (const [name, spec, b, xs] of [["cnn", S.imageCnn(1, 28, 28, S.DEFAULT_CNN, 10), 16, "image"],
                                    ["mlp", S.mlp(64, 128, 10), 16, "dense"]]) {
  const theta = initParams(spec, 3);
  let seed = 11;
  const rnd = (n) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return (seed >>> 8) % n; };
  const x = xs === "image" ? Uint8Array.from({ length: b * 784 }, () => rnd(256))
    : Float64Array.from({ length: b * 64 }, () => rnd(17));
  const y = Int32Array.from({ length: b }, () => rnd(10));
  const sums = [];
  for (const u of [wasm, new P.CpuUnits(luts)]) {
    const total = new Float64Array(theta.length);
    await new Engine(spec, u).gradInto(total, theta, x, y, b, 40, 2 ** 49);
    sums.push(Array.from(total));
  }
  out[name] = { same: sums[0].every((v, i) => v === sums[1][i]), nonzero: sums[0].filter((v) => v !== 0).length };
}
console.log(JSON.stringify(out));
""", imports={"S": "engine/spec.js", "{ Engine, initParams }": "engine/model.js"})
    for name in ("cnn", "mlp"):
        assert got[name]["same"], name
        assert got[name]["nonzero"] > 100, name


def test_out_of_range_operand_is_refused_with_the_js_units_words():
    got = run_wasm("""
const out = [];
const wide = (i, v) => { const a = new Int32Array(32).fill(-128); a[i] = v; return a; }; // 16 at a time
for (const f of [() => wasm.gemm(Int32Array.of(1, 200), Int32Array.of(1, 1), { m: 1, k: 2, n: 1 }),
                 () => wasm.gemm(wide(5, 300), new Int32Array(32), { m: 1, k: 32, n: 1 }),
                 () => wasm.gemm(new Int32Array(32), wide(17, -129), { m: 1, k: 32, n: 1 }),
                 () => wasm.maxpool(Int32Array.of(1, 2, 3, -300), 1, { c: 1, h: 2, w: 2 }),
                 () => wasm.requantize(Int32Array.of(1), 32)]) {
  try { await f(); out.push(null); } catch (e) { out.push(`${e.name}: ${e.message}`); }
}
console.log(JSON.stringify(out));
""")
    assert got == ["UnitError: gemm: A[1] must be an integer in [-128, 127], got 200",
                   "UnitError: gemm: A[5] must be an integer in [-128, 127], got 300",
                   "UnitError: gemm: B[17] must be an integer in [-128, 127], got -129",
                   "UnitError: maxpool: a[3] must be an integer in [-128, 127], got -300",
                   "UnitError: requantize: shift must be an integer in [0, 31], got 32"]


def test_a_module_that_is_not_exact_is_never_used():
    """A module whose requantize rounds half down (one instruction changed), a module whose
    bytes are not the pinned ones, and tables that are not the exact ones: each refused,
    with the reason in words; the exact module passes."""
    head = (WASM / "units.wat").read_text().rstrip()
    wat = f"{head[:-1]}\n" + "\n".join(f.read_text() for f in sorted(WASM.glob("units.*.wat"))) + ")\n"  # as the build
    bad_wat = wat.replace("(i32x4.shr_s (local.get $v) (local.get $s1)) (local.get $one))",
                          "(i32x4.shr_s (local.get $v) (local.get $s)) (local.get $one))", 1)
    assert bad_wat != wat
    got = run_wasm("""
const wabt = await wabtInit();
const mod = wabt.parseWat("bad.wat", DATA.wat, { simd: true });
const bad = Uint8Array.from(mod.toBinary({}).buffer);
const wrongCheck = await W.openWasmUnits(luts, { bytes: bad });
const wrongPin = await W.openWasmUnits(luts, { bytes: bad, pinned });
const flipped = { ...luts, requantize: luts.requantize.slice() };
flipped.requantize[32768 + 64] = 0;
const wrongTable = await W.openWasmUnits(flipped, { bytes: wasmBytes, pinned });
console.log(JSON.stringify([wrongCheck, wrongPin, wrongTable].map((r) => [r.units === null, r.reason])));
""", data={"wat": bad_wat}, imports={"{ default as wabtInit }": ROOT / "node_modules" / "wabt" / "index.js"})
    assert got[0][0] and got[0][1].startswith("the WebAssembly SIMD module failed its self-check (requantize shift 1")
    assert got[1][0] and "not its pinned" in got[1][1]
    assert got[2][0] and "the loaded requantize table is not the rounding shift at 64" in got[2][1]


def test_a_call_the_memory_cannot_hold_runs_on_the_js_units():
    """When the browser refuses to grow the module's memory, the call gives the JS units'
    bytes (it runs on them) instead of failing the step."""
    got = run_wasm("""
const a = Int32Array.from({ length: 300 * 400 }, (_, i) => (i * 37) % 255 - 127);
const b = Int32Array.from({ length: 400 * 200 }, (_, i) => (i * 91) % 255 - 127);
const desc = { m: 300, k: 400, n: 200 };
const mem = wasm.mem;
wasm.mem = { get buffer() { return mem.buffer; }, grow() { throw new RangeError("WebAssembly.Memory.grow(): Maximum memory size exceeded"); } };
const small = await wasm.gemm(Int32Array.of(3), Int32Array.of(-4), { m: 1, k: 1, n: 1 });
const big = await wasm.gemm(a, b, desc);
const ref = await new P.CpuUnits(luts).gemm(a, b, desc);
console.log(JSON.stringify({ small: Array.from(small), same: big.every((v, i) => v === ref[i]), n: big.length,
  couldNotHold: mem.buffer.byteLength < 4 * (a.length + b.length) }));
""")
    assert got == {"small": [-12], "same": True, "n": 60000, "couldNotHold": True}


def test_maxpool_and_its_back_four_windows_at_a_time_equal_the_js_units():
    """maxpool and maxpool_back take 4 windows a step (units.wat), the rest one at a time: on maps whose
    windows per row are 1, 3, 4, 5, 8 and 9, odd maps (a dropped row and column), and values
    in [-2, 2] (ties everywhere: the first maximum wins), they give the JS units' bytes; a g or
    an a outside int8 inside a 4-window step is refused with the JS units' words."""
    got = run_wasm("""
let seed = 7;
const rnd = (n) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return (seed >>> 8) % n; };
const cpu = new P.CpuUnits(luts);
const out = { same: [], errors: [] };
for (const [b, c, h, w] of [[1, 1, 2, 2], [2, 3, 6, 6], [1, 2, 8, 8], [3, 2, 7, 10], [2, 1, 16, 17], [1, 4, 5, 18], [2, 2, 4, 9]]) {
  const geom = { c, h, w };
  const oh = h >> 1, ow = w >> 1;
  const a = Int32Array.from({ length: b * c * h * w }, () => rnd(5) - 2);
  a[0] = 127; a[1] = -128;
  const g = Int32Array.from({ length: b * c * oh * ow }, () => rnd(256) - 128);
  const x = await wasm.maxpoolBack(g, a, b, geom);
  const y = await cpu.maxpoolBack(g, a, b, geom);
  out.same.push(x.length === y.length && x.every((v, i) => v === y[i]) && x.some((v) => v !== 0));
  const p = await wasm.maxpool(a, b, geom);
  const q = await cpu.maxpool(a, b, geom);
  out.same.push(p.length === q.length && p.every((v, i) => v === q[i]));
}
for (const [which, i, v] of [["g", 2, 128], ["a", 5, -129], ["p", 9, 200]]) {
  const a = new Int32Array(16); const g = new Int32Array(4);
  (which === "g" ? g : a)[i] = v;
  try {
    if (which === "p") await wasm.maxpool(a, 1, { c: 1, h: 2, w: 8 }); else await wasm.maxpoolBack(g, a, 1, { c: 1, h: 2, w: 8 });
    out.errors.push(null);
  } catch (e) { out.errors.push(`${e.name}: ${e.message}`); }
}
console.log(JSON.stringify(out));
""")
    assert got["same"] == [True] * 14
    assert got["errors"] == ["UnitError: maxpoolBack: g[2] must be an integer in [-128, 127], got 128",
                             "UnitError: maxpoolBack: a[5] must be an integer in [-128, 127], got -129",
                             "UnitError: maxpool: a[9] must be an integer in [-128, 127], got 200"]

"""Unit tier (node): Adam in the WebAssembly module (webui/wasm/units.adam.wat, wasm_adam.js
WasmAdam) gives the Python engine's adam_step bits: the SHA-256 of theta, m and v after the
kernel's very first calls (a process that opened nothing, no self-check before: the code V8's
baseline compiler made) and after hundreds of steps (the optimised code), on the digits
model's size with its power-of-two mean-gradient scale, an odd size with a divisor, weight
decay and the learning-rate schedule, and a plain float gradient; stepped in place on the
kernel's own arrays (the trainer's way) and on arrays copied in and out. A trainer on the
WASM units steps its Adam in the module and ends on the JS units' trainer's hash; a module
whose Adam kernel reassociates one product is refused by its self-check at open, with the
reason in words."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from daisychain.engine.adam import AdamState, adam_step
from daisychain.engine.spec import Hyper
from jsrun import run_js
from test_wasm_units import ROOT, WASM, run_wasm

pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node

STEPS = 300

#: per case: size, gscale, gdiv, Hyper fields, whether the total is an integer total (else a
#: float gradient with gscale = gdiv = 1)
CASES = [(9610, 2.0**-42, 1.0, {"lr": 3e-3}, True),  # digits: 4 micro-batches, S = 40
         (37, 2.0**-40, 3.0, {"lr": 6e-3, "weight_decay": 0.01, "lr_warmup": 5, "lr_decay_steps": 250}, True),
         (5, 1.0, 1.0, {"lr": 1e-2}, False)]


def _total(n: int, t: int, integer: bool) -> np.ndarray:
    """Step t's gradient, made the same way in JS (exact integers below 2**53)."""
    i = np.arange(n, dtype=np.int64)
    q = ((i * 2654435761 + t * 40503) % (2**31)) - 2**30
    q = q * (2 ** (i % 9))
    return q if integer else q.astype(np.float64) * 2.0**-50


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, "<f8").tobytes()).hexdigest()


def _python(n, gscale, gdiv, fields, integer):
    hp = Hyper(**fields)
    rng = np.random.default_rng(n)
    theta0 = rng.normal(size=n) * 0.1
    theta, st = theta0.copy(), AdamState.zeros(n)
    out = []
    for t in range(STEPS):
        adam_step(theta, st, _total(n, t, integer), hp, gscale, gdiv)
        if t in (0, 1, STEPS - 1):
            out.append([_sha(theta), _sha(st.m), _sha(st.v)])
    assert np.count_nonzero(theta != theta0) == n  # every parameter moved: the hashes can differ
    job = {"n": n, "gscale": gscale, "gdiv": gdiv, "integer": integer, "theta": theta0.astype("<f8").tobytes().hex(),
           "hp": {k: getattr(hp, k) for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "lr_warmup", "lr_decay_steps")}}
    return job, out


COLD = r"""
const { createHash } = await import("node:crypto");
// a fresh module in a process that opened nothing: the kernel's first calls are its cold code
const { module } = await WebAssembly.instantiate(readFileSync(new URL("wasm/units.wasm", WEBUI)), {});
const sha = (a) => createHash("sha256").update(new Uint8Array(a.buffer, a.byteOffset, a.byteLength)).digest("hex");
const out = [];
for (const job of DATA.jobs) {
  const n = job.n;
  const theta0 = new Float64Array(Uint8Array.from(Buffer.from(job.theta, "hex")).buffer);
  const k = new A.WasmAdam(module, n); // in place, on the kernel's own arrays (the trainer's way)
  k.theta.set(theta0);
  const st = k.state();
  const k2 = new A.WasmAdam(module, n); // any other arrays: copied in and out
  const th2 = theta0.slice();
  const st2 = new AdamState(n);
  const got = [[], []];
  const g = new Float64Array(n);
  for (let t = 0; t < DATA.steps; t++) {
    for (let i = 0; i < n; i++) {
      const q = (((i * 2654435761 + t * 40503) % 2147483648) - 1073741824) * 2 ** (i % 9);
      g[i] = job.integer ? q : q * 2 ** -50;
    }
    k.step(k.theta, st, g, job.hp, job.gscale, job.gdiv);
    k2.step(th2, st2, g, job.hp, job.gscale, job.gdiv);
    if (t === 0 || t === 1 || t === DATA.steps - 1) {
      got[0].push([sha(k.theta), sha(st.m), sha(st.v)]);
      got[1].push([sha(th2), sha(st2.m), sha(st2.v)]);
    }
  }
  out.push(got);
}
console.log(JSON.stringify(out));
"""


def test_the_adam_kernel_gives_python_adam_bits_from_its_first_cold_calls():
    jobs, want = zip(*(_python(*c) for c in CASES))
    got = run_js(COLD, imports={"A": "wasm/wasm_adam.js", "{ AdamState }": "engine/adam.js"},
                 data={"jobs": list(jobs), "steps": STEPS})
    for (n, *_), w, (in_place, copied) in zip(CASES, want, got):
        assert in_place == w, f"{n} values, stepped in place"
        assert copied == w, f"{n} values, copied in and out"


def test_a_trainer_on_the_wasm_units_steps_adam_in_the_module_to_the_js_units_hash():
    got = run_wasm("""
const S = await import(new URL("engine/spec.js", WEBUI));
const { Trainer } = await import(new URL("engine/trainer.js", WEBUI));
const spec = S.mlp(12, 9, 4);
const x = Float64Array.from({ length: 96 * 12 }, (_, i) => ((i * 37) % 23) - 11);
const y = Int32Array.from({ length: 96 }, (_, i) => (i * 7) % 4);
const ds = { kind: "dense", x_train: { data: x, shape: [96, 12] }, y_train: { data: y, shape: [96] } };
const hyper = S.makeHyper({ seed: 4, batch: 32, micro_batch: 8, lr: 0.01 });
const out = [];
for (const units of [wasm, new P.CpuUnits(luts)]) {
  const tr = await Trainer.create({ spec, hyper, dataset: ds, luts, units });
  for (let s = 0; s < 25; s++) tr.apply((await tr.contribute([0, 1, 2, 3])).grad);
  out.push([!!tr.adamKernel, tr.theta.buffer === (tr.adamKernel && tr.adamKernel.mem.buffer), await tr.paramsSha256()]);
}
console.log(JSON.stringify(out));
""")
    assert got[0][:2] == [True, True] and got[1][:2] == [False, False]
    assert got[0][2] == got[1][2]


def test_a_module_whose_adam_is_not_exact_is_never_used():
    """v = beta2 * v + (1 - beta2) * (g * g) computed as ((1 - beta2) * g) * g: one product
    reassociated, in the vector loop or in the odd element's; each refused at open."""
    head = (WASM / "units.wat").read_text().rstrip()
    wat = f"{head[:-1]}\n" + "\n".join(f.read_text() for f in sorted(WASM.glob("units.*.wat"))) + ")\n"  # as the build
    bad = [wat.replace("(f64x2.mul (local.get $C2) (f64x2.mul (local.get $x) (local.get $x)))",
                       "(f64x2.mul (f64x2.mul (local.get $C2) (local.get $x)) (local.get $x))", 1),
           wat.replace("(f64.mul (local.get $c2) (f64.mul (local.get $sx) (local.get $sx)))",
                       "(f64.mul (f64.mul (local.get $c2) (local.get $sx)) (local.get $sx))", 1)]
    assert all(b != wat for b in bad)
    got = run_wasm("""
const wabt = await wabtInit();
const out = [];
for (const text of DATA.wats) {
  const mod = wabt.parseWat("bad.wat", text, { simd: true });
  const r = await W.openWasmUnits(luts, { bytes: Uint8Array.from(mod.toBinary({}).buffer) });
  out.push([r.units === null, r.reason]);
}
console.log(JSON.stringify(out));
""", data={"wats": bad}, imports={"{ default as wabtInit }": ROOT / "node_modules" / "wabt" / "index.js"})
    for refused, reason in got:
        assert refused and reason.startswith("the WebAssembly SIMD module failed its self-check (Adam ("), reason
        assert "in the module, adamStep gives" in reason

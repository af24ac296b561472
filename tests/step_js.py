"""One golden training step in node (the JS units, no browser): the same fields the browser
harness computes (tests/browser/test_engine_golden.py STEP) from a golden step file of
daisychain/golden/ and the data set it was made from, written to a temporary DCDS file.

    got = run_step(golden, dataset)        # golden: the parsed step_<name>.json
    assert_step(got, golden)               # every field, bit for bit
"""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

from jsrun import LOAD_LUTS, run_js

from daisychain import package_path

STEP = "const lutDir = process.argv[2];\n" + LOAD_LUTS + r"""
const [dataPath, path] = [process.argv[3], process.argv[4]];
const g = DATA;
const { sha256Hex } = L;
const buf = readFileSync(dataPath);
const ds = D.parseDataset(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length));
ds.fingerprint = await sha256Hex(new Uint8Array(buf));
const sha = async (values) => {   // golden.py sha(): int64 LE if all integers, else float64 LE
  const a = Array.from(values);
  const ints = a.every(Number.isInteger);
  const dv = new DataView(new ArrayBuffer(a.length * 8));
  a.forEach((v, i) => ints ? dv.setBigInt64(i * 8, BigInt(v), true) : dv.setFloat64(i * 8, v, true));
  return sha256Hex(new Uint8Array(dv.buffer));
};
const hex = (x) => { const d = new DataView(new ArrayBuffer(8)); d.setFloat64(0, x); return d.getBigUint64(0).toString(16).padStart(16, '0'); };
const units = path === "cpu-lut" ? new P.CpuUnits(luts, { literal: true }) : new P.CpuUnits(luts);
const spec = S.ModelSpec.fromJson(g.model);
const hyper = S.makeHyper(g.hyper);
const tr = await T.Trainer.create({ spec, hyper, dataset: ds, luts, units });
const out = { fingerprint: ds.fingerprint, init: await T.paramsSha256(M.initParams(spec, hyper.seed)),
  init_head: Array.from(tr.theta.subarray(0, 32), hex), samples: [], trace: [] };
const n = hyper.batch / hyper.micro_batch;
for (let j = 0; j < n; j++) out.samples.push(Array.from(tr.samples(0, j)));
const { x } = tr.inputs(0, 0);
const trace = [];
await tr.engine.forward(tr.theta, x, hyper.micro_batch, (name, v) => trace.push([name, Array.from(v)]));
for (const [name, v] of trace) out.trace.push({ name, sha256: await sha(v) });
const per = [];
for (let j = 0; j < n; j++) per.push(await tr.contribute([j]));
out.per_micro = await Promise.all(per.map((r) => sha(r.grad)));
out.micro0 = Array.from(per[0].grad);
const total = new Float64Array(tr.theta.length);
per.forEach((r) => r.grad.forEach((v, i) => { total[i] += v; }));
out.total = await sha(total);
const gm = tr.meanGrad(total);
const dv = new DataView(new ArrayBuffer(gm.length * 8));
gm.forEach((v, i) => dv.setFloat64(i * 8, v, true));
out.mean_grad = await sha256Hex(new Uint8Array(dv.buffer));
const theta = tr.theta.slice();
const st = new A.AdamState(theta.length);
A.adamStep(theta, st, gm, hyper);
out.adam_m = await T.paramsSha256(st.m);
out.adam_v = await T.paramsSha256(st.v);
out.after = await T.paramsSha256(theta);
out.loss_micro = per.map((r) => hex(r.loss[0]));
out.run = [];
for (let s = 0; s < g.run.steps; s++) {
  tr.apply((await tr.contribute(Array.from({ length: n }, (_, j) => j))).grad);
  out.run.push(await tr.paramsSha256());
}
out.accuracy = await tr.accuracy();
console.log(JSON.stringify(out));
"""

IMPORTS = {"L": "units/luts.js", "D": "engine/data.js", "S": "engine/spec.js", "T": "engine/trainer.js",
           "M": "engine/model.js", "A": "engine/adam.js", "P": "engine/cpu_units.js"}


def run_step(golden: dict, dataset, path: str = "cpu", timeout: float = 600) -> dict:
    """The JS engine's step fields for ``golden`` on ``dataset`` (a Dataset), on the JS units
    (``path`` "cpu": the fast GEMM, "cpu-lut": every product read from the table)."""
    with tempfile.TemporaryDirectory(prefix="step-js-") as tmp:
        data = Path(tmp) / "data.dcds"
        data.write_bytes(dataset.to_bytes())
        return run_js(STEP, IMPORTS, data=golden, timeout=timeout,
                      args=[str(package_path("luts")), str(data), path])


def assert_step(got: dict, g: dict) -> None:
    """Every field of the golden step file, bit for bit (the display loss to 1e-12)."""
    s0 = g["step0"]
    assert got["fingerprint"] == g["dataset_fingerprint"]
    assert got["init"] == g["init_params_sha256"]
    assert got["init_head"] == g["init_params_f64_head"]
    assert got["samples"] == s0["micro_batch_samples"]
    assert [t["name"] for t in got["trace"]] == [t["name"] for t in s0["forward_micro0"]]
    for have, want in zip(got["trace"], s0["forward_micro0"]):
        assert have["sha256"] == want["sha256"], have["name"]
    if s0["grad_fixed_micro0"] is not None:
        assert got["micro0"] == s0["grad_fixed_micro0"]
    assert got["per_micro"] == s0["grad_fixed_per_micro_sha256"]
    assert got["total"] == s0["grad_fixed_total_sha256"]
    assert got["mean_grad"] == s0["mean_grad_sha256"]
    assert got["adam_m"] == s0["adam_m_sha256"] and got["adam_v"] == s0["adam_v_sha256"]
    assert got["after"] == s0["params_after_sha256"]
    # the display loss uses the library log (display only): to 1e-12
    for have, want in zip(got["loss_micro"], s0["loss_micro"]):
        a, b = (struct.unpack(">d", bytes.fromhex(h))[0] for h in (have, want))
        assert abs(a - b) <= 1e-12 * abs(b)
    assert got["run"] == g["run"]["params_sha256_per_step"]
    assert got["accuracy"] == g["run"]["test_accuracy"]

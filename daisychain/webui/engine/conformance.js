// Conformance of one compute path (CpuUnits or GpuUnits), DOM-free, shared by the /selftest
// page (selftest.js) and the device self-test before joining a run (mesh.js):
//   runGolden(units, golden)      every golden unit vector (/golden/units.json), set by set
//   goldenFailure(units, golden)  null, or the first failure in words
//   gemmRate, microBatchRate      capacity figures (timings only; nothing feeds training)

import { int32LeBytes, sha256Hex } from "../luts.js";
import { Engine, initParams } from "./model.js";
import { u32, uniform } from "./prng.js";
import { makeHyper, mlp } from "./spec.js";
import { gradLimit } from "./trainer.js";

/** Compare got (Int32Array) with the golden: SHA-256 of the int32 LE bytes, and elements. */
async function compare(got, wantOut, wantSha) {
  const sha = await sha256Hex(int32LeBytes(got));
  const res = { pass: true, sha256: sha };
  if (wantSha && sha !== wantSha) {
    res.pass = false;
    res.detail = `SHA-256 ${sha} != golden ${wantSha}`;
  }
  if (wantOut) {
    if (wantOut.length !== got.length) {
      return { ...res, pass: false, detail: `length ${got.length} != golden ${wantOut.length}` };
    }
    for (let i = 0; i < got.length; i++) {
      if (got[i] !== wantOut[i]) {
        return { ...res, pass: false, detail: `element ${i}: got ${got[i]}, golden ${wantOut[i]}` };
      }
    }
  }
  return res;
}

function matrix(values, fill, len) {
  return values ? Int8Array.from(values) : new Int8Array(len).fill(fill);
}

/** Run every vector set through one path; returns {pass, sets, failures}. */
export async function runGolden(units, golden) {
  const sets = {};
  const failures = [];
  const record = (set, name, res) => {
    if (!res.pass) failures.push(`${set}${name ? ` ${name}` : ""}: ${res.detail}`);
  };
  const guarded = async (set, name, fn) => {
    try {
      return await fn();
    } catch (err) {
      return { pass: false, detail: `${err.name}: ${err.message}` };
    }
  };

  let r = await guarded("mul", "", async () => compare(
    await units.mul(Int8Array.from(golden.mul.a), Int8Array.from(golden.mul.b)), golden.mul.out));
  record("mul", "", r);
  sets.mul = { pass: r.pass, count: golden.mul.out.length, detail: r.detail || null };

  r = await guarded("relu", "", async () => compare(await units.relu(Int8Array.from(golden.relu.x)), golden.relu.out));
  record("relu", "", r);
  sets.relu = { pass: r.pass, count: golden.relu.out.length, detail: r.detail || null };

  r = await guarded("requantize", "", async () => {
    const { acc, shift, out } = golden.requantize;
    const got = new Int32Array(acc.length).fill(0x7fffffff);
    for (let s = 0; s <= 31; s++) {
      const idx = [];
      for (let i = 0; i < shift.length; i++) if (shift[i] === s) idx.push(i);
      if (!idx.length) continue;
      const res = await units.requantize(Int32Array.from(idx, (i) => acc[i]), s);
      idx.forEach((i, j) => { got[i] = res[j]; });
    }
    return compare(got, out);
  });
  record("requantize", "", r);
  sets.requantize = { pass: r.pass, count: golden.requantize.out.length, detail: r.detail || null };

  const cases = {};
  for (const g of golden.gemm) {
    r = await guarded("gemm", g.name, async () => {
      const a = matrix(g.a, g.a_fill, g.m * g.k);
      const b = matrix(g.b, g.b_fill, g.k * g.n);
      return compare(await units.gemm(a, b, { m: g.m, k: g.k, n: g.n }), g.out, g.out_sha256);
    });
    record("gemm", g.name, r);
    cases[g.name] = { pass: r.pass, detail: r.detail || null };
  }
  sets.gemm = { pass: Object.values(cases).every((c) => c.pass), cases };
  return { pass: failures.length === 0, sets, failures };
}

/** The golden vectors through one path: null when all pass, else the first failure. */
export async function goldenFailure(units, golden) {
  const g = await runGolden(units, golden);
  return g.pass ? null : g.failures[0];
}

/** Unit-GEMM rate of one path: 2*M*K*N integer ops per GEMM, repeated for >= ~minMs. */
export async function gemmRate(units, { m = 64, k = 256, n = 64, minMs = 300 } = {}) {
  let seed = 12345;
  const rand = () => { seed = (Math.imul(seed, 1103515245) + 12345) | 0; return ((seed >>> 16) & 255) - 128; };
  const a = Int8Array.from({ length: m * k }, rand);
  const b = Int8Array.from({ length: k * n }, rand);
  await units.gemm(a, b, { m, k, n }); // warm up (pipeline, JIT)
  let runs = 0;
  const t0 = performance.now();
  let dt = 0;
  while (dt < minMs || runs < 2) {
    await units.gemm(a, b, { m, k, n });
    runs++;
    dt = performance.now() - t0;
  }
  return { shape: [m, k, n], runs, ms: dt, gops: (2 * m * k * n * runs) / (dt * 1e6) };
}

/** Micro-batches per second of one path: the default digits model (64-128-10) on a synthetic
 *  micro-batch of 16, forward + backward + fixed-point contribution. */
export async function microBatchRate(units, { minMs = 300 } = {}) {
  const spec = mlp(64, 128, 10);
  const hp = makeHyper();
  const engine = new Engine(spec, units);
  const theta = initParams(spec, 1);
  const b = hp.micro_batch;
  const x = uniform(1, 99, b * 64).map((v) => Math.floor(v * 17));
  const y = Int32Array.from(u32(1, 98, b), (v) => v % 10);
  const total = new Float64Array(theta.length);
  const run = () => engine.gradInto(total, theta, x, y, b, hp.grad_frac_bits, gradLimit(hp));
  await run();
  let runs = 0;
  const t0 = performance.now();
  let dt = 0;
  while (dt < minMs || runs < 2) {
    await run();
    runs++;
    dt = performance.now() - t0;
  }
  return runs / (dt / 1000);
}


// Conformance of one compute path (CpuUnits or GpuUnits), DOM-free, shared by the /selftest
// page (selftest.js) and the device self-test before joining a run (mesh.js):
//   runGolden(units, golden)      every golden unit vector (/golden/units.json: mul, relu, exp,
//                                 requantize, gemm), set by set, the image units against the
//                                 JS units (imageUnitCases) and the transformer's gemmBatch and
//                                 softmax against their definitions (attentionUnitCases)
//   goldenFailure(units, golden)  null, or the first failure in words
//   floatFailures(golden)         one Adam step on the golden Adam vectors and the golden
//                                 subnormal operations (/golden/selftest.json, the same
//                                 vectors as daisychain/peer/selftest.py): [] or failures in words
//   gemmRate, microBatchRate      capacity figures (timings only; nothing feeds training)

import { col2imArray, im2colArray, maxpoolArray, maxpoolBackArray } from "../units/conv.js";
import { int32LeBytes, sha256Hex } from "../units/luts.js";
import { softmaxArray } from "./attention.js";
import { adamStep, AdamState } from "./adam.js";
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

  r = await guarded("exp", "", async () => compare(await units.exp(Int8Array.from(golden.exp.z)), golden.exp.out));
  record("exp", "", r);
  sets.exp = { pass: r.pass, count: golden.exp.out.length, detail: r.detail || null };

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

  const imageCases = {};
  for (const [name, run] of imageUnitCases()) {
    r = await guarded("image", name, async () => {
      const [got, want] = await run(units);
      return compare(got, want, null);
    });
    record("image", name, r);
    imageCases[name] = { pass: r.pass, detail: r.detail || null };
  }
  sets.image = { pass: Object.values(imageCases).every((c) => c.pass), cases: imageCases };

  const attnCases = {};
  for (const [name, run] of attentionUnitCases(golden)) {
    r = await guarded("attention", name, async () => {
      const [got, want] = await run(units);
      return compare(got, want, null);
    });
    record("attention", name, r);
    attnCases[name] = { pass: r.pass, detail: r.detail || null };
  }
  sets.attention = { pass: Object.values(attnCases).every((c) => c.pass), cases: attnCases };
  return { pass: failures.length === 0, sets, failures };
}

/**
 * The transformer's units of a path (gemmBatch in every layout, softmax through the exp unit)
 * against their definitions in plain JS on fixed PRNG inputs: -128 * -128, odd shapes, score
 * rows that saturate the exp unit's input, exponents that scale up and down. The softmax's
 * reference reads the exp table of the golden vectors. [[name, async (units) => [got, want]]]
 */
export function attentionUnitCases(golden) {
  const ints = (stream, n, lo, hi) => Int32Array.from(u32(9, stream, n), (v) => lo + (v % (hi - lo + 1)));
  const out = [];
  for (const [batch, m, k, n, transA, transB] of [[3, 5, 7, 4, false, true], [2, 8, 8, 3, true, false], [4, 1, 9, 6, false, false]]) {
    const a = ints(2000 + m, batch * m * k, -128, 127);
    const b = ints(2100 + n, batch * k * n, -128, 127);
    a[0] = -128;
    b[0] = -128;
    const want = new Int32Array(batch * m * n);
    for (let z = 0; z < batch; z++) {
      for (let i = 0; i < m; i++) {
        for (let j = 0; j < n; j++) {
          let acc = 0;
          for (let kk = 0; kk < k; kk++) {
            acc += a[z * m * k + (transA ? kk * m + i : i * k + kk)] * b[z * k * n + (transB ? j * k + kk : kk * n + j)];
          }
          want[(z * m + i) * n + j] = acc;
        }
      }
    }
    const tag = `gemmBatch ${batch}x${m}x${k}x${n}${transA ? " Aᵀ" : ""}${transB ? " Bᵀ" : ""}`;
    out.push([tag, async (u) => [await u.gemmBatch(a, b, { batch, m, k, n, transA, transB }), want]]);
  }
  const table = new Int32Array(256);
  golden.exp.z.forEach((z, i) => { table[z + 128] = golden.exp.out[i]; });
  for (const [nb, T, E, lim] of [[3, 8, -6, 16384], [2, 5, 3, 40], [2, 16, -30, 4194304], [1, 7, -1, 4194304], [2, 4, 9, 3], [1, 6, -40, 4194304]]) {
    const sc = ints(2200 + T, nb * T * T, -lim, lim);
    out.push([`softmax ${nb}x${T}x${T} E ${E}`, async (u) => [await u.softmax(sc, nb, T, E), softmaxArray(sc, nb, T, E, { exp: table })]]);
  }
  return out;
}

/**
 * The image units of a path (im2col, col2im, maxpool, maxpoolBack) against the JS units of
 * conv.js (checked against numpy and the conv goldens by the tests) on fixed PRNG inputs:
 * padding at every border, odd sizes (a dropped last row / column), pool windows full of
 * ties, col2im sums at the int32 bound. [[name, async (units) => [got, want]], ...]
 */
export function imageUnitCases() {
  const ints = (stream, n, lo, hi) => Int32Array.from(u32(7, stream, n), (v) => lo + (v % (hi - lo + 1)));
  const out = [];
  for (const [b, ci, k, h, w] of [[2, 3, 3, 5, 7], [1, 2, 5, 4, 3]]) {
    const g = { ci, k, h, w };
    const tag = `${b}x${ci}x${h}x${w} k${k}`;
    const a = ints(1000 + k, b * ci * h * w, -128, 127);
    const bound = Math.floor(2147483647 / (k * k));
    const d = ints(1100 + k, b * h * w * ci * k * k, -bound, bound);
    d.fill(bound, 0, Math.min(d.length, 2 * k * k));
    out.push([`im2col ${tag}`, async (u) => [await u.im2col(a, b, g), im2colArray(a, b, g)]]);
    out.push([`col2im ${tag}`, async (u) => [await u.col2im(d, b, g), col2imArray(d, b, g)]]);
  }
  for (const [b, c, h, w] of [[2, 3, 5, 7], [1, 2, 4, 4]]) {
    const g = { c, h, w };
    const a = ints(1200 + h, b * c * h * w, -2, 2); // many ties
    const e = ints(1300 + h, b * c * (h >> 1) * (w >> 1), -127, 127);
    out.push([`maxpool ${b}x${c}x${h}x${w}`, async (u) => [await u.maxpool(a, b, g), maxpoolArray(a, b, g)]]);
    out.push([`maxpoolBack ${b}x${c}x${h}x${w}`, async (u) => [await u.maxpoolBack(e, a, b, g), maxpoolBackArray(e, a, b, g)]]);
  }
  return out;
}

/** The golden vectors through one path: null when all pass, else the first failure. */
export async function goldenFailure(units, golden) {
  const g = await runGolden(units, golden);
  return g.pass ? null : g.failures[0];
}

// -- float64: one Adam step, subnormals -------------------------------------------------------

/** 16-hex-digit IEEE-754 bit patterns (big-endian text) -> Float64Array; throws on bad input. */
export function unhex(xs) {
  if (!Array.isArray(xs) || !xs.every((x) => typeof x === "string" && /^[0-9a-f]{16}$/.test(x))) {
    throw new Error("expected a list of 16-hex-digit strings");
  }
  const out = new Float64Array(xs.length);
  const dv = new DataView(out.buffer);
  xs.forEach((x, i) => dv.setBigUint64(8 * i, BigInt(`0x${x}`), true));
  return out;
}

export function fhex(values) {
  const a = Float64Array.from(values);
  const dv = new DataView(a.buffer);
  return Array.from(a, (_, i) => dv.getBigUint64(8 * i, true).toString(16).padStart(16, "0"));
}

const f64Sha = (a) => sha256Hex(new Uint8Array(Float64Array.from(a).buffer));

function floatOp(op, a, b) {
  switch (op) {
    case "mul": return a * b;
    case "add": return a + b;
    case "sub": return a - b;
    case "div": return a / b;
    case "sqrt": return Math.sqrt(a);
    default: throw new Error(`unknown operation ${JSON.stringify(op)}`);
  }
}

/** One Adam step (adam.js) per golden case: [] or what differs, in words. */
export async function adamFailures(cases) {
  const bad = [];
  for (const c of cases) {
    try {
      const hp = makeHyper(c.hyper);
      const theta = unhex(c.theta);
      const st = new AdamState(theta.length);
      const m = unhex(c.m);
      const v = unhex(c.v);
      const g = unhex(c.g);
      if (m.length !== theta.length || v.length !== theta.length || g.length !== theta.length) throw new Error("the vectors differ in length");
      st.m.set(m);
      st.v.set(v);
      st.step = c.step;
      [st.b1t, st.b2t] = unhex([c.b1t, c.b2t]);
      adamStep(theta, st, g, hp);
      let failed = false;
      for (const [key, got] of [["theta", theta], ["m", st.m], ["v", st.v]]) {
        const sha = await f64Sha(got);
        if (sha !== c.out[`${key}_sha256`]) {
          const gh = fhex(got);
          const i = gh.findIndex((x, j) => x !== c.out[key][j]);
          bad.push(`Adam step (${c.name}): ${key} hashes to ${sha.slice(0, 16)}…, golden ${c.out[`${key}_sha256`].slice(0, 16)}… ` +
            `(${i >= 0 ? `${key}[${i}] is ${gh[i]} here, golden ${c.out[key][i]}` : gh.length !== c.out[key].length ? `${key} has ${gh.length} values, golden ${c.out[key].length}` : "the values match the golden values, not the golden hash"})`);
          failed = true;
          break;
        }
      }
      if (!failed && fhex([st.b1t, st.b2t]).join() !== [c.out.b1t, c.out.b2t].join()) {
        bad.push(`Adam step (${c.name}): the bias-correction products differ`);
      }
    } catch (err) {
      bad.push(`Adam step: a malformed golden case (${err.message})`);
    }
  }
  return bad;
}

/** The golden subnormal operations: [] or what differs, in words. */
export function subnormalFailures(cases) {
  const bad = [];
  cases.forEach((c, i) => {
    let got;
    try {
      const [a, b] = unhex([c.a, c.b]);
      got = fhex([floatOp(c.op, a, b)])[0];
    } catch (err) {
      bad.push(`subnormals: a malformed golden case ${i} (${err.message})`);
      return;
    }
    if (got !== c.out) {
      const flushed = (BigInt(`0x${got}`) & 0x7fffffffffffffffn) === 0n ? " (flushed to zero)" : "";
      bad.push(`subnormals: ${c.op}(${c.a}, ${c.b}) is ${got} here, golden ${c.out}${flushed}`);
    }
  });
  return bad;
}

/** The float64 self-test of this device (the same on every path: Adam runs in JS). */
export async function floatFailures(golden) {
  const bad = [];
  for (const [what, run] of [["Adam vectors", () => adamFailures(golden.adam)],
    ["subnormal vectors", () => subnormalFailures(golden.subnormal)]]) {
    try {
      bad.push(...(await run()));
    } catch (err) {
      bad.push(`the golden ${what} are malformed (${err.message})`);
    }
  }
  return bad;
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

/** Micro-batches per second of one path: forward + backward + fixed-point contribution of a
 *  synthetic micro-batch of 16 through `spec` (default: the digits model 64-128-10; an image
 *  spec gets random pixels, a tokens spec random ids). */
export async function microBatchRate(units, { minMs = 300, spec = mlp(64, 128, 10) } = {}) {
  const hp = makeHyper();
  const engine = new Engine(spec, units);
  const theta = initParams(spec, 1);
  const b = hp.micro_batch;
  const n = b * spec.inputDim;
  const x = spec.inputKind === "image" ? Uint8Array.from(u32(1, 97, n), (v) => v & 255)
    : spec.inputKind === "tokens" ? Int32Array.from(u32(1, 97, n), (v) => v % spec.layers[0].nIn)
      : uniform(1, 99, n).map((v) => Math.floor(v * 17));
  const y = Int32Array.from(u32(1, 98, b), (v) => v % spec.classes);
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


// Interleaved A/B timing of the WASM module's `gemm` kernel alone, in one node process: the
// unit GEMM 256³ and the shapes a default-CNN micro-batch of 16 runs through the resident plan
// (wasm/wasm_plan.js; mp x np x kp as profile_micro.mjs names them). Each variant is a module
// file, `label=PATH.wasm` (this tree's: daisychain/webui/wasm/units.wasm; another commit's:
// `git show REV:daisychain/webui/wasm/units.wasm > /tmp/old.wasm`), its own instance and
// memory holding the same random int8 operands; each round runs every shape on every variant
// in turn; the report is each shape's best G int-ops/s (2·mp·np·kp / time) per variant and the
// median of the rounds' speed-ups against the first variant. Every variant's output must be
// the same bytes, on its first (cold) call and after (the script fails otherwise). A variant
// `label=PATH.wasm:op` runs the module's outer-product kernel (`gemm_op`, units.op.wat) on
// the same operands, B laid out interleaved by its `narrow_il` once, before the timing. Usage:
//   node bench/js/ab_gemm.mjs [--rounds R] [--ms T] label=PATH.wasm[:op] ...
import { readFileSync } from "node:fs";
import { createHash } from "node:crypto";

const args = process.argv.slice(2);
const opt = (name, dflt) => { const i = args.indexOf(name); return i < 0 ? dflt : Number(args.splice(i, 2)[1]); };
const rounds = opt("--rounds", 5);
const budget = opt("--ms", 40); // each timing repeats the call until this many ms have passed
const SHAPES = [[256, 256, 256], [12544, 16, 16], [3136, 32, 144], [784, 64, 288], [32, 144, 3136],
  [64, 288, 784], [144, 3136, 32], [288, 784, 64]];

let seed = 11;
const rnd = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return ((seed >>> 8) & 255) - 128; };
const maxA = Math.max(...SHAPES.map(([m, , k]) => m * k));
const maxB = Math.max(...SHAPES.map(([, n, k]) => n * k));
const maxBytes = maxA + maxB + Math.max(...SHAPES.map(([m, n]) => 4 * m * n));
const A8 = Int8Array.from({ length: maxA + maxB }, rnd);
A8[0] = -128; // -128 · -128 sums at the edge
A8[1] = -128;

async function variant(spec) {
  const [label, file] = spec.split("=");
  const [path, mode] = file.split(":");
  const { instance } = await WebAssembly.instantiate(readFileSync(path), {});
  const { memory, gemm, gemm_op: gemmOp, narrow_il: narrowIl } = instance.exports;
  const il = maxBytes + 16; // gemm_op's B per shape: its int32 copy, then interleaved
  memory.grow(Math.ceil((maxBytes + 12 * maxB + 65536) / 65536));
  new Int8Array(memory.buffer).set(A8, 0); // A at 0, B at maxA, C at maxA + maxB (every shape)
  const interleaved = new Map();
  for (const [, n, k] of mode === "op" ? SHAPES : []) { // B (n, k) int8 rows -> interleaved int16
    const key = `${n}x${k}`;
    if (interleaved.has(key)) continue;
    new Int32Array(memory.buffer, il, n * k).set(new Int8Array(memory.buffer, maxA, n * k));
    const dst = il + 4 * n * k;
    new Uint8Array(memory.buffer, dst, 2 * n * k).fill(0);
    narrowIl(il, dst, n, k, 1, k / 2);
    interleaved.set(key, new Uint8Array(memory.buffer, dst, 2 * n * k).slice());
  }
  let cur = null;
  const call = mode === "op" ? ([m, n, k]) => {
    const key = `${n}x${k}`;
    if (cur !== key) { new Uint8Array(memory.buffer, il, 2 * n * k).set(interleaved.get(key)); cur = key; }
    gemmOp(0, k, il, maxA + maxB, m, n, k / 2);
  } : ([m, n, k]) => gemm(0, maxA, maxA + maxB, m, n, k);
  const out = ([m, n]) => new Uint8Array(memory.buffer, maxA + maxB, 4 * m * n);
  const sha = SHAPES.map((s) => { call(s); return createHash("sha256").update(out(s)).digest("hex"); }); // cold
  for (const s of SHAPES) for (let i = 0; i < 3; i++) call(s);
  SHAPES.forEach((s, i) => {
    call(s);
    if (createHash("sha256").update(out(s)).digest("hex") !== sha[i]) throw new Error(`${label}: ${s} warm differs from cold`);
  });
  return { label, call, sha, best: SHAPES.map(() => Infinity), ms: SHAPES.map(() => []) };
}

const vs = [];
for (const a of args) vs.push(await variant(a));
for (const v of vs) {
  v.sha.forEach((h, i) => { if (h !== vs[0].sha[i]) { console.error(`${v.label}: ${SHAPES[i].join("x")} differs from ${vs[0].label}`); process.exit(1); } });
}
for (let r = 0; r < rounds; r++) {
  SHAPES.forEach((s, si) => {
    for (const v of vs) {
      let reps = 0;
      const t0 = performance.now();
      let t = t0;
      while (t - t0 < budget) { v.call(s); reps++; t = performance.now(); }
      const ms = (t - t0) / reps;
      v.ms[si].push(ms);
      v.best[si] = Math.min(v.best[si], ms);
    }
  });
}
const median = (xs) => { const s = [...xs].sort((p, q) => p - q); return s[s.length >> 1]; };
console.log(`gemm alone, G int-ops/s (best of ${rounds} rounds), speed-up vs ${vs[0].label} (median of rounds)`);
console.log(`${"shape mp x np x kp".padEnd(18)} ${vs.map((v) => v.label.padStart(16)).join(" ")}`);
SHAPES.forEach((s, si) => {
  const ops = 2 * s[0] * s[1] * s[2];
  const cells = vs.map((v) => {
    const g = (ops / v.best[si] / 1e6).toFixed(1);
    const x = median(v.ms[si].map((m, r) => vs[0].ms[si][r] / m)).toFixed(2);
    return `${g} (${x}x)`.padStart(16);
  });
  console.log(`${s.join("x").padEnd(18)} ${cells.join(" ")}`);
});

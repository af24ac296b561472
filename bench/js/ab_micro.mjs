// Interleaved A/B timing of one default-CNN micro-batch (forward + backward + fixed-point
// sum, micro-batch 16, MNIST-sized random input) on the tab's CPU paths, in one node process,
// so every variant meets the same load: each round times N micro-batches of every variant in
// turn; the report is every round's ms per micro-batch, the best and the median, and the
// speed-up against the first variant. A variant is
// `label=WEBUI:MODE`, WEBUI a webui tree (this one: daisychain/webui; another commit's:
// `git archive REV daisychain/webui | tar -x -C DIR`, its module built with that commit's
// scripts/build_wasm.mjs), MODE cpu | wasm (the resident plan where the tree has one) |
// wasm-units (the WASM units one call at a time). Every variant's contribution must be the
// same bytes (the script fails otherwise). Usage:
// `--digits`: the digits MLP (64-128-10) instead of the CNN.
//   node bench/js/ab_micro.mjs [--rounds R] [--n N] [--digits] label=WEBUI:MODE ...
import { createHash } from "node:crypto";
import { openVariant, luts } from "./_variant.mjs";


const args = process.argv.slice(2);
const opt = (name, dflt) => { const i = args.indexOf(name); return i < 0 ? dflt : Number(args.splice(i, 2)[1]); };
const rounds = opt("--rounds", 5);
const n = opt("--n", 5);
const digits = args.includes("--digits") && args.splice(args.indexOf("--digits"), 1).length > 0; // the digits MLP instead
const b = 16;

async function variant(spec) {
  const { label, web, units } = await openVariant(spec);
  const S = await import(new URL("engine/spec.js", web));
  const { Engine, initParams } = await import(new URL("engine/model.js", web));
  const model = digits ? S.mlp(64, 128, 10) : S.imageCnn(1, 28, 28, S.DEFAULT_CNN, 10);
  const theta = initParams(model, 1);
  let seed = 7;
  const rnd = (m) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return (seed >>> 8) % m; };
  const x = digits ? Float64Array.from({ length: b * 64 }, () => rnd(17)) : Uint8Array.from({ length: b * 784 }, () => rnd(256));
  const y = Int32Array.from({ length: b }, () => rnd(10));
  const eng = new Engine(model, units);
  const run = async () => {
    const total = new Float64Array(theta.length);
    await eng.gradInto(total, theta, x, y, b, 40, 2 ** 49);
    return total;
  };
  for (let i = 0; i < 3; i++) await run();
  const sha = createHash("sha256").update(new Uint8Array((await run()).buffer)).digest("hex");
  return { label, run, sha, ms: [] };
}

const vs = [];
for (const a of args) vs.push(await variant(a));
for (let r = 0; r < rounds; r++) {
  for (const v of vs) {
    const t0 = performance.now();
    for (let i = 0; i < n; i++) await v.run();
    v.ms.push((performance.now() - t0) / n);
  }
}
const median = (xs) => { const s = [...xs].sort((p, q) => p - q); return s[s.length >> 1]; };
// the speed-up against the first variant: the median of the rounds' ratios (each round's
// variants ran back to back, under about the same load), and the ratio of the best rounds
for (const v of vs) {
  const ratio = median(v.ms.map((m, r) => vs[0].ms[r] / m));
  const best = Math.min(...vs[0].ms) / Math.min(...v.ms);
  const f = (m) => m.toFixed(m < 10 ? 3 : 1).padStart(6); // a digits micro-batch is a fraction of a ms
  console.log(`${v.label.padEnd(12)} best ${f(Math.min(...v.ms))} ms, median ${f(median(v.ms))} ms; ` +
    `vs ${vs[0].label}: ${ratio.toFixed(2)}x (median of rounds), ${best.toFixed(2)}x (best)  sha256 ${v.sha.slice(0, 16)}`);
  console.log(`${"".padEnd(12)} rounds ${v.ms.map((m) => m.toFixed(m < 10 ? 3 : 1)).join(" ")}`);
}
if (new Set(vs.map((v) => v.sha)).size !== 1) {
  console.error("the variants' contributions differ");
  process.exit(1);
}

// Interleaved A/B timing of whole training steps in node, as /selftest trains them (engine/
// trainer.js: a step's micro-batches through Trainer.contribute, then apply's Adam step), so
// every variant meets the same load and the parameters change every step (the plan quantizes
// the weights again each step). A variant is `label=WEBUI:MODE` as in ab_micro.mjs (MODE cpu |
// wasm | wasm-units). Each variant trains its own run from the same seed; each round times S
// steps of every variant in turn, after W warm-up steps each; the report is the micro-batches
// per second of every round, the best and the median, and the speed-up against the first
// variant. Every variant must end on the same params-sha256 (the script fails otherwise).
// The dataset is a .dcds file, e.g. the digits task's:
//   .venv/bin/python -c "from daisychain.engine.data import prepare_task as p; import sys; sys.stdout.buffer.write(p('digits').to_bytes())" > /tmp/digits.dcds
//   node bench/js/ab_steps.mjs [--rounds R] [--steps S] [--warm W] [--task digits] DATA.dcds label=WEBUI:MODE ...
import { readFileSync } from "node:fs";
import { openVariant, luts } from "./_variant.mjs";


const args = process.argv.slice(2);
const opt = (name, dflt) => { const i = args.indexOf(name); return i < 0 ? dflt : args.splice(i, 2)[1]; };
const rounds = Number(opt("--rounds", 5));
const steps = Number(opt("--steps", 20));
const warm = Number(opt("--warm", 5));
const task = opt("--task", "digits");
const data = readFileSync(args.shift());

async function variant(spec) {
  const { label, web, units } = await openVariant(spec);
  const S = await import(new URL("engine/spec.js", web));
  const D = await import(new URL("engine/data.js", web));
  const { Trainer } = await import(new URL("engine/trainer.js", web));
  const { TASK_DEFAULTS } = await import(new URL("engine/task_defaults.js", web));
  const ds = D.parseDataset(data);
  const model = S.modelFor(ds, null, 16);
  const total = warm + rounds * steps;
  const hyper = S.makeHyper({ lr: TASK_DEFAULTS[task].lr, seed: 3, ...S.recipeSettings(task, total, {}) });
  const tr = await Trainer.create({ spec: model, hyper, dataset: ds, luts, units });
  const ids = Array.from({ length: hyper.batch / hyper.micro_batch }, (_, j) => j);
  const run = async (n) => {
    for (let s = 0; s < n; s++) tr.apply((await tr.contribute(ids)).grad);
    return n * ids.length;
  };
  await run(warm);
  return { label, run, tr, rates: [] };
}

const vs = [];
for (const a of args) vs.push(await variant(a));
for (let r = 0; r < rounds; r++) {
  for (const v of vs) {
    const t0 = performance.now();
    const mb = await v.run(steps);
    v.rates.push(mb / ((performance.now() - t0) / 1000));
  }
}
const median = (xs) => { const s = [...xs].sort((p, q) => p - q); return s[s.length >> 1]; };
const shas = [];
for (const v of vs) {
  const ratio = median(v.rates.map((m, r) => m / vs[0].rates[r]));
  const best = Math.max(...v.rates) / Math.max(...vs[0].rates);
  const sha = await v.tr.paramsSha256();
  shas.push(sha);
  console.log(`${v.label.padEnd(12)} best ${Math.max(...v.rates).toFixed(0).padStart(6)} micro-batches/s, median ${median(v.rates).toFixed(0).padStart(6)}; ` +
    `vs ${vs[0].label}: ${ratio.toFixed(2)}x (median of rounds), ${best.toFixed(2)}x (best)  params-sha256 ${sha.slice(0, 16)}`);
  console.log(`${"".padEnd(12)} rounds ${v.rates.map((m) => m.toFixed(0)).join(" ")}`);
}
if (new Set(shas).size !== 1) {
  console.error("the variants' parameters differ");
  process.exit(1);
}

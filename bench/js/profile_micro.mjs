// Where one micro-batch of the default CNN goes on the tab's CPU path, in node: every call of
// the units interface timed by op and shape, the rest of forward + backward (quantize,
// bias, layout moves, softmax, accumulate) as "engine JS". `wasm` runs the resident plan
// (wasm/wasm_plan.js: the micro-batch in the module's memory; its kernels timed by name as
// "plan <kernel>"), `wasm-units` the WASM units one call at a time (the plan off). Usage:
//   node bench/js/profile_micro.mjs [cpu|wasm|wasm-units] [repeats]
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
const WEBUI = new URL("../../daisychain/webui/", import.meta.url);
const LUTS = fileURLToPath(new URL("../../daisychain/luts/", import.meta.url));
const S = await import(new URL("engine/spec.js", WEBUI));
const { Engine, initParams } = await import(new URL("engine/model.js", WEBUI));
const paths = await import(new URL("engine/cpu_units.js", WEBUI));
const rd = (n) => { const b = readFileSync(`${LUTS}/${n}.bin`); return new Int32Array(b.buffer, b.byteOffset, b.length / 4).slice(); };
const luts = { mul: rd("mul"), relu: rd("relu"), requantize: rd("requantize"),
  manifestSha256: JSON.parse(readFileSync(`${LUTS}/manifest.json`)).manifest_sha256 };
const which = process.argv[2] || "cpu";
const reps = Number(process.argv[3] || 10);
let base;
if (which.startsWith("wasm")) {
  const { openWasmUnits } = await import(new URL("wasm/wasm_units.js", WEBUI));
  const bytes = readFileSync(fileURLToPath(new URL("wasm/units.wasm", WEBUI)));
  const r = await openWasmUnits(luts, { bytes });
  if (!r.units) throw new Error(r.reason);
  base = r.units;
  if (which === "wasm-units") base.resident = false;
} else base = new paths.CpuUnits(luts);
const times = new Map();
const units = new Proxy(base, {
  get(t, prop) {
    const f = t[prop];
    if (typeof f !== "function") return f;
    return async (...args) => {
      const t0 = performance.now();
      const r = await f.apply(t, args);
      const key = prop === "gemm" ? `gemm ${args[2].m}x${args[2].k}x${args[2].n}${args[2].transA ? " tA" : ""}${args[2].transB ? " tB" : ""}` : String(prop);
      times.set(key, (times.get(key) || 0) + performance.now() - t0);
      return r;
    };
  },
});
const b = 16;
const spec = S.imageCnn(1, 28, 28, S.DEFAULT_CNN, 10);
const theta = initParams(spec, 1);
let seed = 7;
const rnd = (n) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return (seed >>> 8) % n; };
const x = Uint8Array.from({ length: b * 784 }, () => rnd(256));
const y = Int32Array.from({ length: b }, () => rnd(10));
const eng = new Engine(spec, units);
for (let i = 0; i < 3; i++) await eng.gradInto(new Float64Array(theta.length), theta, x, y, b, 40, 2 ** 49);
for (const plan of [await base.residentPlan?.(spec, b)].filter(Boolean)) { // time the plan's kernels by name
  const k = plan.k;
  plan.k = Object.fromEntries(Object.entries(k).map(([name, f]) => [name, typeof f !== "function" ? f : (...args) => {
    const t0 = performance.now();
    const r = f(...args);
    const key = name === "gemm" ? `plan gemm ${args.slice(3).join("x")}`
      : name === "gemm_op" ? `plan gemm_op ${args[4]}x${args[5]}x${2 * args[6]}` : `plan ${name}`;
    times.set(key, (times.get(key) || 0) + performance.now() - t0);
    return r;
  }]));
}
times.clear();
const t0 = performance.now();
for (let i = 0; i < reps; i++) await eng.gradInto(new Float64Array(theta.length), theta, x, y, b, 40, 2 ** 49);
const total = (performance.now() - t0) / reps;
let inUnits = 0;
const rows = [...times.entries()].sort((p, q) => q[1] - p[1]).map(([k, v]) => { inUnits += v / reps; return [k, v / reps]; });
console.log(`${which}: one micro-batch of 16 (default CNN) ${total.toFixed(1)} ms`);
for (const [k, v] of rows) console.log(`  ${v.toFixed(2).padStart(8)} ms ${(100 * v / total).toFixed(1).padStart(5)}%  ${k}`);
const inPlan = rows.filter(([k]) => k.startsWith("plan ")).reduce((t, [, v]) => t + v, 0);
console.log(`  ${(total - inUnits).toFixed(2).padStart(8)} ms ${(100 * (total - inUnits) / total).toFixed(1).padStart(5)}%  engine JS outside the units${inPlan ? " and the plan's kernels" : ""}`);

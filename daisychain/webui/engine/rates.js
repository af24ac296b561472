// Capacity measurements of one compute path (CpuUnits or GpuUnits): the unit-GEMM rate and
// the micro-batch rate a peer announces when it joins. Timings only; no result feeds training.

import { Engine, initParams } from "./model.js";
import { u32, uniform } from "./prng.js";
import { makeHyper, mlp } from "./spec.js";
import { gradLimit } from "./trainer.js";

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


// How many times the INT8 units run: multiply, requantize and ReLU invocations as a pure
// function of the model shape and the number of micro-batches computed. A line-for-line twin
// of daisychain/engine/counters.py (held to it by tests/units/test_counters_js.py on shared data,
// tests/data/unit_counts.json); the formula and its reasons are written there. No DOM.
//
//   unitCountsPerMicroBatch(spec, 16)   -> {multiply, requantize, relu}
//   unitCounts(spec, 16, 2400)          -> the same for 2400 micro-batches
//
// `spec` is a ModelSpec of engine/spec.js or its JSON; each layer type's count is its
// registry class's `units` (engine/layers.js, summed by spec.js layerUnitCounts), conv2d and
// maxpool2d included. Counts are Numbers: exact below 2^53 (a run would need ~10^15 unit
// invocations to pass it), the nearest double above.

import { layerUnitCounts, ModelSpec } from "./spec.js";

/** Unit invocations for one micro-batch of `microBatch` samples (forward + backward). */
export function unitCountsPerMicroBatch(spec, microBatch) {
  const s = spec instanceof ModelSpec ? spec : ModelSpec.fromJson(spec);
  return layerUnitCounts(s, Math.trunc(Number(microBatch)));
}

/** Unit invocations for `microBatches` micro-batches of `microBatch` samples. */
export function unitCounts(spec, microBatch, microBatches) {
  const per = unitCountsPerMicroBatch(spec, microBatch);
  const n = Math.trunc(Number(microBatches));
  const out = {};
  for (const [k, v] of Object.entries(per)) {
    const p = v * n;
    out[k] = Number.isSafeInteger(p) ? p : Number(BigInt(v) * BigInt(n));
  }
  return out;
}

/** One line for logs, as counters.py format_counts: "units: multiply 1,234 · requantize …". */
export function formatCounts(counts) {
  return "units: " + Object.entries(counts).map(([k, v]) => `${k} ${v.toLocaleString("en-US")}`).join(" · ");
}

// How many times the INT8 units run: multiply, requantize and ReLU invocations as a pure
// function of the model shape and the number of micro-batches computed. A line-for-line twin
// of daisychain/engine/counters.py (held to it by tests/test_counters_js.py on shared data,
// tests/unit_counts.json); the formula and its reasons are written there. No DOM.
//
//   unitCountsPerMicroBatch(spec, 16)   -> {multiply, requantize, relu}
//   unitCounts(spec, 16, 2400)          -> the same for 2400 micro-batches
//
// `spec` is a ModelSpec of engine/spec.js ({type, nIn, nOut} layers) or its JSON ({type, in,
// out} / {type, vocab, dim}). Counts are Numbers: exact below 2^53 (a run would need ~10^15
// unit invocations to pass it), the nearest double above.

function layerDims(l) {
  if (l.type === "linear") return [l.nIn ?? l.in, l.nOut ?? l.out];
  if (l.type === "embedding") return [l.nIn ?? l.vocab, l.nOut ?? l.dim];
  return [0, 0];
}

/** Unit invocations for one micro-batch of `microBatch` samples (forward + backward). */
export function unitCountsPerMicroBatch(spec, microBatch) {
  const b = Math.trunc(Number(microBatch));
  let mul = 0;
  let rq = 0;
  let relu = 0;
  const layers = spec.layers;
  const linears = layers.map((l, i) => (l.type === "linear" ? i : -1)).filter((i) => i >= 0);
  const hasEmb = layers[0].type === "embedding";
  let width = 0;
  layers.forEach((l, i) => {
    if (l.type === "linear") {
      const [nIn, nOut] = layerDims(l);
      mul += 2 * b * nIn * nOut; // forward + weight gradient
      const first = i === linears[0];
      if (!first || hasEmb) mul += b * nIn * nOut; // error into the layer below
      if (!first) rq += b * nIn; // that error is requantized before the next GEMM
      if (i !== linears[linears.length - 1]) rq += b * nOut; // forward activation
      width = nOut;
    } else if (l.type === "relu") {
      relu += b * width;
    }
  });
  return { multiply: mul, requantize: rq, relu };
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

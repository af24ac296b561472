// The two compute paths behind one async interface, so engine and self-test code never
// care which one runs:
//   gemm(a, b, {m, k, n, transA, transB}) -> Int32Array (M, N)
//   requantize(acc, shift, {relu})         -> Int32Array of int8 values
//   mul(a, b), relu(x), exp(z)              -> Int32Array
//   im2col(a, b, geom), col2im(d, b, geom)  -> Int32Array    (conv.js has the layouts)
//   maxpool(a, b, geom), maxpoolBack(g, a, b, geom) -> Int32Array
//   gemmBatch(a, b, {batch, m, k, n, transA, transB}) -> Int32Array (batch, M, N): `batch`
//                                           GEMMs on consecutive (M, K) / (K, N) blocks
//   softmax(scores, nb, T, E)               -> Int32Array (engine/attention.js softmaxArray)
// CpuUnits (engine/cpu_units.js) runs the JS units (units.js, gemm.js); WasmUnits (wasm/wasm_units.js) the
// WebAssembly SIMD kernels, a CpuUnits whose heavy units run in WASM with the same bytes;
// GpuUnits (gpu.js) the WGSL kernels. openPaths() tries WASM and the GPU and, for each that
// cannot be used, says why in words.

import { GpuUnits } from "../units/gpu.js";
import { openWasmUnits } from "../wasm/wasm_units.js";
import { CpuUnits } from "./cpu_units.js";

/**
 * Open the JS units, the WebAssembly SIMD path and, unless disabled, the GPU path.
 * @returns {Promise<{cpu: CpuUnits, wasm: WasmUnits|null, wasmReason: string|null,
 *   gpu: GpuUnits|null, gpuReason: string|null}>}
 */
export async function openPaths(luts, { tryGpu = true, tryWasm = true, shaderBase = "/shaders/", wasmBase = "/webui/wasm/", onGpuFailure } = {}) {
  const cpu = new CpuUnits(luts);
  const { wasm, wasmReason } = tryWasm ? await openWasm(luts, wasmBase)
    : { wasm: null, wasmReason: "the WebAssembly path was not requested" };
  if (!tryGpu) return { cpu, wasm, wasmReason, gpu: null, gpuReason: "the GPU path was not requested" };
  try {
    const gpu = await GpuUnits.create({ luts, shaderBase, onFailure: onGpuFailure });
    gpu.name = "gpu";
    return { cpu, wasm, wasmReason, gpu, gpuReason: null };
  } catch (err) {
    return { cpu, wasm, wasmReason, gpu: null, gpuReason: err.message };
  }
}

/** The WASM path, or why it cannot be used. */
export async function openWasm(luts, base = "/webui/wasm/") {
  const { units, reason } = await openWasmUnits(luts, { base });
  return { wasm: units, wasmReason: reason };
}

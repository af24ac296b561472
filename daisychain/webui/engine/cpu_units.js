// The JS units behind the compute paths' one async interface (engine/paths.js):
//   gemm(a, b, {m, k, n, transA, transB}) -> Int32Array (M, N)
//   requantize(acc, shift, {relu})         -> Int32Array of int8 values
//   mul(a, b), relu(x), exp(z)              -> Int32Array
//   im2col(a, b, geom), col2im(d, b, geom)  -> Int32Array    (conv.js has the layouts)
//   maxpool(a, b, geom), maxpoolBack(g, a, b, geom) -> Int32Array
//   gemmBatch(a, b, {batch, m, k, n, transA, transB}) -> Int32Array (batch, M, N)
//   softmax(scores, nb, T, E)               -> Int32Array (engine/attention.js softmaxArray)
// They are the reference and the fallback; WasmUnits (wasm/wasm_units.js) extends them.

import { gemmFast, gemmLayout, gemmLut } from "../units/gemm.js";
import { col2imArray, convLayout, im2colArray, maxpoolArray, maxpoolBackArray, poolLayout } from "../units/conv.js";
import { expArray, mulArray, POISON, reluArray, requantizeArray } from "../units/units.js";
import { softmaxArray } from "./attention.js";

export class CpuUnits {
  /** @param {object} luts verified tables; @param {{literal?: boolean}} opts literal -> gemmLut */
  constructor(luts, { literal = false } = {}) {
    this.luts = luts;
    this.name = literal ? "cpu-lut" : "cpu";
    this._gemm = literal ? gemmLut : gemmFast;
    this.usable = true;
  }

  // Outputs are poisoned with 0x7fffffff first, as on the GPU, so an unwritten element fails.
  async gemm(a, b, desc) {
    const { m, n } = gemmLayout(desc);
    return this._gemm(a, b, desc, this.luts, new Int32Array(m * n).fill(POISON));
  }

  /** `batch` GEMMs, one per consecutive block of A and B, through this path's gemm. */
  async gemmBatch(a, b, desc) {
    const { batch, ...one } = desc;
    const { m, k, n } = gemmLayout(one);
    if (!Number.isInteger(batch) || batch < 1) throw new RangeError(`gemmBatch: batch must be a positive integer, got ${batch}`);
    if (a.length !== batch * m * k || b.length !== batch * k * n) {
      throw new RangeError(`gemmBatch: A has ${a.length}, B ${b.length} elements; the shape needs ${batch * m * k} and ${batch * k * n}`);
    }
    const out = new Int32Array(batch * m * n);
    for (let i = 0; i < batch; i++) {
      out.set(await this.gemm(a.subarray(i * m * k, (i + 1) * m * k), b.subarray(i * k * n, (i + 1) * k * n), one), i * m * n);
    }
    return out;
  }

  async softmax(scores, nb, T, E) {
    return softmaxArray(scores, nb, T, E, this.luts, new Int32Array(nb * T * T).fill(POISON));
  }

  async requantize(acc, shift, { relu = false } = {}) {
    return requantizeArray(acc, shift, this.luts, { relu, out: new Int32Array(acc.length).fill(POISON) });
  }

  async mul(a, b) {
    return mulArray(a, b, this.luts, new Int32Array(a.length).fill(POISON));
  }

  async relu(x) {
    return reluArray(x, this.luts, new Int32Array(x.length).fill(POISON));
  }

  async exp(z) {
    return expArray(z, this.luts, new Int32Array(z.length).fill(POISON));
  }

  async im2col(a, b, geom) {
    const { hw, cols } = convLayout("im2col", b, geom);
    return im2colArray(a, b, geom, new Int32Array(b * hw * cols).fill(POISON));
  }

  async col2im(d, b, geom) {
    const { hw } = convLayout("col2im", b, geom);
    return col2imArray(d, b, geom, new Int32Array(b * geom.ci * hw).fill(POISON));
  }

  async maxpool(a, b, geom) {
    const { oh, ow } = poolLayout("maxpool", b, geom);
    return maxpoolArray(a, b, geom, new Int32Array(b * geom.c * oh * ow).fill(POISON));
  }

  async maxpoolBack(g, a, b, geom) {
    return maxpoolBackArray(g, a, b, geom);
  }

  onFailure() {}
}

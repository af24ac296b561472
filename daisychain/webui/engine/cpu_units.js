// The JS units behind the compute paths' one async interface (engine/paths.js):
//   gemm(a, b, {m, k, n, transA, transB}) -> Int32Array (M, N)
//   requantize(acc, shift, {relu})         -> Int32Array of int8 values
//   mul(a, b), relu(x)                      -> Int32Array
//   im2col(a, b, geom), col2im(d, b, geom)  -> Int32Array    (conv.js has the layouts)
//   maxpool(a, b, geom), maxpoolBack(g, a, b, geom) -> Int32Array
// They are the reference and the fallback; WasmUnits (wasm/wasm_units.js) extends them.

import { gemmFast, gemmLayout, gemmLut } from "../gemm.js";
import { POISON } from "../gpu.js";
import { col2imArray, convLayout, im2colArray, maxpoolArray, maxpoolBackArray, poolLayout } from "../conv.js";
import { mulArray, reluArray, requantizeArray } from "../units.js";

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

  async requantize(acc, shift, { relu = false } = {}) {
    return requantizeArray(acc, shift, this.luts, { relu, out: new Int32Array(acc.length).fill(POISON) });
  }

  async mul(a, b) {
    return mulArray(a, b, this.luts, new Int32Array(a.length).fill(POISON));
  }

  async relu(x) {
    return reluArray(x, this.luts, new Int32Array(x.length).fill(POISON));
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

// Prepared datasets in the DCDS byte format of daisychain/engine/data.py:
//   b"DCDS", u32 LE header length, header (canonical JSON, UTF-8), then the arrays named in
//   header.arrays in that order, each raw little-endian, row-major ("<f8", "<i4", or "|u1" /
//   "<u1" for the uint8 pixels of an image task).
// The dataset fingerprint is the SHA-256 of these bytes.

import { sha256Hex } from "../units/luts.js";

const ITEM_SIZE = { "<f8": 8, "<i4": 4, "|u1": 1, "<u1": 1 };

export class DataError extends Error {
  constructor(message) {
    super(message);
    this.name = "DataError";
  }
}

/** @returns {{task, kind, classes, meta, x_train, y_train, x_test, y_test}} arrays as {data, shape} */
export function parseDataset(buffer) {
  const bytes = new Uint8Array(buffer);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.length < 8 || String.fromCharCode(...bytes.subarray(0, 4)) !== "DCDS") {
    throw new DataError("not a DaisyChain dataset (bad magic)");
  }
  const n = dv.getUint32(4, true);
  let head;
  try {
    head = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes.subarray(8, 8 + n)));
  } catch (err) {
    throw new DataError(`malformed dataset header: ${err.message}`);
  }
  let off = 8 + n;
  const arrays = {};
  if (!head || !Array.isArray(head.arrays)) throw new DataError("malformed dataset header: no list of arrays");
  for (const a of head.arrays) {
    const size = ITEM_SIZE[a && a.dtype];
    if (!size) throw new DataError(`array ${a && a.name}: unsupported dtype ${a && a.dtype}`);
    if (!Array.isArray(a.shape) || !a.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      throw new DataError(`array ${a.name}: malformed shape ${JSON.stringify(a.shape)}`);
    }
    const count = a.shape.reduce((x, y) => x * y, 1);
    // the bytes must be there before anything of the claimed size is allocated
    if (!Number.isSafeInteger(count * size) || off + count * size > bytes.length) throw new DataError("dataset has missing bytes");
    let data;
    if (a.dtype === "<f8") {
      data = new Float64Array(count);
      for (let i = 0; i < count; i++) data[i] = dv.getFloat64(off + 8 * i, true);
    } else if (a.dtype === "<i4") {
      data = new Int32Array(count);
      for (let i = 0; i < count; i++) data[i] = dv.getInt32(off + 4 * i, true);
    } else {
      data = bytes.slice(off, off + count);
    }
    off += count * size;
    arrays[a.name] = { data, shape: a.shape };
  }
  if (off !== bytes.length) throw new DataError("dataset has trailing or missing bytes");
  for (const k of ["x_train", "y_train", "x_test", "y_test"]) {
    if (!arrays[k]) throw new DataError(`dataset lacks the array ${k}`);
  }
  return { task: head.task, kind: head.kind, classes: head.classes, meta: head.meta, ...arrays };
}

/** Fetch /data/<task>.dcds (or a given URL), parse it and compute its fingerprint. */
export async function loadDataset(url) {
  const resp = await fetch(url, { cache: "no-store" });
  if (!resp.ok) throw new DataError(`${url}: HTTP ${resp.status}`);
  const buffer = await resp.arrayBuffer();
  const ds = parseDataset(buffer);
  ds.fingerprint = await sha256Hex(buffer);
  return ds;
}

// The unit tables in the browser: load /luts/manifest.json, fetch every table (the extra
// units too: exp), check each
// SHA-256 (crypto.subtle, or sha256.js outside a secure context) and the manifest's own manifest_sha256, exactly as
// daisychain/units/luts.py defines them. A mismatch is refused with the file named.
//
// manifest_sha256 = SHA-256 of the UTF-8 text made of one line per unit, sorted by name:
//   "<name> <file> <dtype> <shape joined by x> <sha256>\n"

import { sha256Bytes } from "./sha256.js";

export const DTYPE = "<i4";
export const UNIT_SHAPE = { mul: [65536], relu: [256], requantize: [65536] };
/** units added after format 1, under the manifest's "extra_units" (luts.py EXTRA_SHAPE): each
 *  is hash-checked on load like the others but left out of manifest_sha256 (the exp unit: the
 *  transformer's softmax, docs/ENGINE.md "The exp unit") */
export const EXTRA_SHAPE = { exp: [256] };

export class LutError extends Error {
  constructor(message) {
    super(message);
    this.name = "LutError";
  }
}

const HEX = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, "0"));

/** SHA-256 of bytes (ArrayBuffer or a typed array view) as lowercase hex: crypto.subtle
 * where the page has it, the plain-JS sha256.js outside a secure context (same digest). */
export async function sha256Hex(bytes) {
  const view = bytes instanceof ArrayBuffer ? new Uint8Array(bytes)
    : new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const subtle = globalThis.crypto && globalThis.crypto.subtle;
  const digest = subtle ? new Uint8Array(await subtle.digest("SHA-256", view)) : sha256Bytes(view);
  let s = "";
  for (const b of digest) s += HEX[b];
  return s;
}

/** Little-endian int32 bytes of an Int32Array (or any array of int32 values). */
export function int32LeBytes(values) {
  const out = new Uint8Array(values.length * 4);
  const dv = new DataView(out.buffer);
  for (let i = 0; i < values.length; i++) dv.setInt32(i * 4, values[i], true);
  return out;
}

/** Decode little-endian int32 bytes (whatever the platform's byte order). */
export function int32FromLe(buffer) {
  const dv = new DataView(buffer);
  const out = new Int32Array(buffer.byteLength >>> 2);
  for (let i = 0; i < out.length; i++) out[i] = dv.getInt32(i * 4, true);
  return out;
}

function byCodePoint(a, b) {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** The manifest_sha256 of a manifest's `units` object (luts.py `manifest_hash`). */
export async function manifestHash(units) {
  let text = "";
  for (const name of Object.keys(units).sort(byCodePoint)) {
    const u = units[name];
    text += `${name} ${u.file} ${u.dtype} ${u.shape.join("x")} ${u.sha256}\n`;
  }
  return sha256Hex(new TextEncoder().encode(text));
}

/** Validate a parsed manifest as luts.py `read_manifest` does; throws LutError. */
export async function checkManifest(manifest, where = "manifest.json") {
  const units = manifest && typeof manifest === "object" ? manifest.units : null;
  const names = units && typeof units === "object" ? Object.keys(units).sort(byCodePoint) : [];
  const want = Object.keys(UNIT_SHAPE).sort(byCodePoint);
  if (!units || names.join(",") !== want.join(",")) {
    throw new LutError(`${where}: must describe exactly the units ${want.join(", ")}`);
  }
  const extra = manifest.extra_units;
  const extraNames = extra && typeof extra === "object" ? Object.keys(extra).sort(byCodePoint) : [];
  const wantExtra = Object.keys(EXTRA_SHAPE).sort(byCodePoint);
  if (!extra || typeof extra !== "object" || extraNames.join(",") !== wantExtra.join(",")) {
    throw new LutError(`${where}: must describe exactly the extra units ${wantExtra.join(", ")} (run \`daisychain export-luts\`)`);
  }
  const shapes = { ...UNIT_SHAPE, ...EXTRA_SHAPE };
  for (const [name, u] of Object.entries({ ...units, ...extra })) {
    if (!u || typeof u !== "object" || !["file", "dtype", "shape", "sha256"].every((k) => k in u)) {
      throw new LutError(`${where}: entry ${name} lacks file/dtype/shape/sha256`);
    }
    if (u.dtype !== DTYPE || !Array.isArray(u.shape) || u.shape.join("x") !== shapes[name].join("x")) {
      throw new LutError(`${where}: ${name} must be ${DTYPE} of shape (${shapes[name]})`);
    }
    if (typeof u.file !== "string" || !/^[A-Za-z0-9_.-]+$/.test(u.file) || u.file === "." || u.file === "..") {
      throw new LutError(`${where}: ${name} file name ${JSON.stringify(u.file)} must be a plain name`);
    }
  }
  const got = await manifestHash(units);
  if (manifest.manifest_sha256 !== got) {
    throw new LutError(`${where}: manifest_sha256 does not match its entries (computed ${got}, ` +
      `manifest says ${manifest.manifest_sha256})`);
  }
}

/**
 * Load and verify the unit tables.
 * @param {string} base  URL prefix of the tables, default "/luts/"
 * @returns {Promise<{mul: Int32Array, requantize: Int32Array, relu: Int32Array, exp: Int32Array,
 *                    manifest: object, manifestSha256: string, expSha256: string}>}
 */
export async function loadLuts(base = "/luts/") {
  const where = `${base}manifest.json`;
  let manifest;
  try {
    const resp = await fetch(where, { cache: "no-store" });
    if (!resp.ok) throw new LutError(`${where}: HTTP ${resp.status}`);
    manifest = await resp.json();
  } catch (err) {
    if (err instanceof LutError) throw err;
    throw new LutError(`${where}: could not be read (${err.message})`);
  }
  await checkManifest(manifest, where);
  const tables = {};
  const shapes = { ...UNIT_SHAPE, ...EXTRA_SHAPE };
  for (const name of Object.keys(shapes)) {
    const u = manifest.units[name] || manifest.extra_units[name];
    const url = `${base}${u.file}`;
    const resp = await fetch(url, { cache: "no-store" });
    if (!resp.ok) throw new LutError(`${url}: HTTP ${resp.status} (table for unit ${name})`);
    const bytes = await resp.arrayBuffer();
    const got = await sha256Hex(bytes);
    if (got !== u.sha256) {
      throw new LutError(`${url}: SHA-256 ${got} does not match the manifest's ${u.sha256} ` +
        `(table for unit ${name} is corrupt or was changed)`);
    }
    if (bytes.byteLength !== shapes[name][0] * 4) {
      throw new LutError(`${url}: ${bytes.byteLength} bytes, expected ${shapes[name][0] * 4}`);
    }
    tables[name] = int32FromLe(bytes);
  }
  return { ...tables, manifest, manifestSha256: manifest.manifest_sha256, expSha256: manifest.extra_units.exp.sha256 };
}

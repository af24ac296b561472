// What the interleaved A/B benches (ab_micro.mjs, ab_steps.mjs) share: this repository's unit
// tables, and a variant `label=WEBUI:MODE` opened on its own webui tree's units (MODE cpu: the
// JS units; wasm: the WASM units with the resident plan where the tree has one; wasm-units:
// the WASM units one call at a time).
import { readFileSync } from "node:fs";
import { fileURLToPath, pathToFileURL } from "node:url";
import { resolve } from "node:path";

const LUTS = fileURLToPath(new URL("../../daisychain/luts/", import.meta.url));
const rd = (n) => { const b = readFileSync(`${LUTS}/${n}.bin`); return new Int32Array(b.buffer, b.byteOffset, b.length / 4).slice(); };
export const luts = { mul: rd("mul"), relu: rd("relu"), requantize: rd("requantize"),
  manifestSha256: JSON.parse(readFileSync(`${LUTS}/manifest.json`)).manifest_sha256 };

/** {label, web (the tree's file URL, ending in /), units} of `label=WEBUI:MODE`. */
export async function openVariant(spec) {
  const [label, rest] = spec.split("=");
  const [dir, mode] = rest.split(":");
  const web = pathToFileURL(resolve(dir) + "/");
  let units;
  if (mode === "cpu") {
    units = new (await import(new URL("engine/cpu_units.js", web))).CpuUnits(luts);
  } else {
    const { openWasmUnits } = await import(new URL("wasm/wasm_units.js", web));
    const r = await openWasmUnits(luts, { bytes: readFileSync(new URL("wasm/units.wasm", web)) });
    if (!r.units) throw new Error(`${label}: ${r.reason}`);
    units = r.units;
    if (mode === "wasm-units") units.resident = false;
  }
  return { label, web, units };
}

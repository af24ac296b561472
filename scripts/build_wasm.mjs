// Assemble the tab's WebAssembly kernels: daisychain/webui/wasm/<name>.wat -> <name>.wasm with
// npm wabt; a module's text is <name>.wat with every fragment <name>.<part>.wat (module
// fields only) inserted before its closing parenthesis, in name order (a module whose text
// would pass the 600-line limit is split by role) (package.json pins the version; scripts/setup.sh installs it). The output is a pure
// function of the text and the wabt version, so two builds give the same bytes; each module's
// SHA-256 is pinned in <name>.wasm.sha256 (committed), and the tab refuses a module that
// hashes otherwise.
//
//   node scripts/build_wasm.mjs           build every module, refuse one that differs from its pin
//   node scripts/build_wasm.mjs --pin     build and (re)write the pins after a .wat change
//   node scripts/build_wasm.mjs --stdout NAME   write NAME's bytes to stdout, touch nothing
import { createHash } from "node:crypto";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const DIR = fileURLToPath(new URL("../daisychain/webui/wasm/", import.meta.url));
const FEATURES = { simd: true }; // no relaxed SIMD: its dot product is not exact everywhere

/** The text of module `name`: <name>.wat with its fragments <name>.*.wat inserted. */
export function source(name) {
  const text = readFileSync(`${DIR}${name}.wat`, "utf8").trimEnd();
  if (!text.endsWith(")")) throw new Error(`${name}.wat does not end with the module's closing parenthesis`);
  const parts = readdirSync(DIR).filter((f) => f.startsWith(`${name}.`) && f.endsWith(".wat") && f !== `${name}.wat`).sort();
  return `${text.slice(0, -1)}${parts.map((f) => `\n${readFileSync(`${DIR}${f}`, "utf8")}`).join("")})\n`;
}

export async function assemble(name) {
  const wabt = await require("wabt")();
  const mod = wabt.parseWat(`${name}.wat`, source(name), FEATURES);
  try {
    mod.validate();
    return Buffer.from(mod.toBinary({ log: false, write_debug_names: false }).buffer);
  } finally {
    mod.destroy();
  }
}

const args = process.argv.slice(2);
if (args[0] === "--stdout") {
  process.stdout.write(await assemble(args[1]));
} else {
  const pin = args.includes("--pin");
  let bad = 0;
  for (const file of readdirSync(DIR).filter((f) => f.endsWith(".wat") && f.split(".").length === 2).sort()) {
    const name = file.slice(0, -4);
    const bytes = await assemble(name);
    const sha = createHash("sha256").update(bytes).digest("hex");
    const pinFile = `${DIR}${name}.wasm.sha256`;
    if (pin) writeFileSync(pinFile, `${sha}\n`);
    let want = null;
    try { want = readFileSync(pinFile, "utf8").trim(); } catch { /* no pin yet */ }
    if (want !== sha) {
      console.error(`build_wasm: ${name}.wasm hashes to ${sha}, its pin ${name}.wasm.sha256 says ` +
        `${want ?? "nothing"} (after a .wat change: node scripts/build_wasm.mjs --pin)`);
      bad++;
      continue;
    }
    writeFileSync(`${DIR}${name}.wasm`, bytes);
    console.log(`build_wasm: ${name}.wasm ${bytes.length} bytes, sha256 ${sha}`);
  }
  process.exit(bad ? 1 : 0);
}

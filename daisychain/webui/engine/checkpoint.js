// Checkpoints in the page, DOM-free. A browser cannot write a .pt, nor read one without
// running a pickle, so the server converts (daisychain/server/routes/checkpoints.py):
//   POST /checkpoint/export   state blob -> the .pt download
//   POST /checkpoint/import   .pt (+ X-Daisy-Expected-Identity) -> state blob, or 400 {error}
// The state blob (daisychain/engine/checkpoint.py encode_state): b"DCSV", u32 LE header
// length, header JSON {identity, step, b1t, b2t, params_sha256}, then theta, Adam m, Adam v
// as float64 little-endian in canonical order. Every blob read here is checked again: sizes,
// finiteness and the SHA-256 of theta against its header.
//
//   const blob = await encodeState(snapshot);        // snapshot: {identity, step, theta, m, v, b1t, b2t}
//   const { bytes, filename } = await exportCheckpoint(snapshot);
//   const st = await importCheckpoint(fileBytes, runIdentityOrNull);   // throws CheckpointError(words)

import { layersText, LOCAL_FIELDS, RECIPE_FIELDS } from "./spec.js";
import { paramsSha256 } from "./trainer.js";

const MAGIC = [0x44, 0x43, 0x53, 0x56]; // "DCSV"

export class CheckpointError extends Error {
  constructor(message) {
    super(message);
    this.name = "CheckpointError";
  }
}

/** The file name the server gives the .pt (and the page uses when it has none). */
export function checkpointName(runId, step) {
  return `daisychain-${runId}-step${step}.pt`;
}

/** A replica snapshot -> the state blob (Uint8Array). */
export async function encodeState({ identity, step, theta, m, v, b1t, b2t }) {
  const n = theta.length;
  if (m.length !== n || v.length !== n) throw new CheckpointError("theta, m and v differ in length");
  const head = new TextEncoder().encode(JSON.stringify({ identity, step, b1t, b2t,
    params_sha256: await paramsSha256(theta) }));
  const out = new Uint8Array(8 + head.length + 24 * n);
  out.set(MAGIC, 0);
  const dv = new DataView(out.buffer);
  dv.setUint32(4, head.length, true);
  out.set(head, 8);
  let off = 8 + head.length;
  for (const a of [theta, m, v]) {
    for (let i = 0; i < n; i++, off += 8) dv.setFloat64(off, a[i], true);
  }
  return out;
}

/** The state blob -> {identity, step, theta, m, v, b1t, b2t, params_sha256}, checked. */
export async function decodeState(bytes) {
  const u8 = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  if (u8.length < 8 || MAGIC.some((b, i) => u8[i] !== b)) throw new CheckpointError("not a DaisyChain state (bad magic)");
  const dv = new DataView(u8.buffer, u8.byteOffset, u8.byteLength);
  const hlen = dv.getUint32(4, true);
  if (8 + hlen > u8.length) throw new CheckpointError("the state header is cut short");
  let head;
  try {
    head = JSON.parse(new TextDecoder().decode(u8.subarray(8, 8 + hlen)));
  } catch (err) {
    throw new CheckpointError(`the state header is not JSON: ${err.message}`);
  }
  if (!head || typeof head !== "object" || !head.identity || typeof head.identity !== "object") {
    throw new CheckpointError("the state header has no run identity");
  }
  const body = u8.length - 8 - hlen;
  if (body % 24) throw new CheckpointError(`the state holds ${body} bytes of tensors, not three float64 vectors`);
  const n = body / 24;
  const read = (k) => {
    const a = new Float64Array(n);
    const base = 8 + hlen + 8 * n * k;
    for (let i = 0; i < n; i++) a[i] = dv.getFloat64(base + 8 * i, true);
    return a;
  };
  const [theta, m, v] = [read(0), read(1), read(2)];
  for (const a of [theta, m, v]) if (!a.every(Number.isFinite)) throw new CheckpointError("the state holds non-finite values");
  const sha = await paramsSha256(theta);
  if (sha !== head.params_sha256) throw new CheckpointError(`parameter hash mismatch: the header says ${head.params_sha256}, the tensors hash to ${sha}`);
  const { step, b1t, b2t } = head;
  if (!Number.isInteger(step) || step < 0) throw new CheckpointError("the state's step is invalid");
  if (![b1t, b2t].every((b) => typeof b === "number" && b >= 0 && b <= 1)) throw new CheckpointError("the state's bias corrections are invalid");
  return { identity: head.identity, step, theta, m, v, b1t, b2t, params_sha256: sha };
}

async function serverError(resp) {
  let text = "";
  try {
    text = await resp.text();
    const j = JSON.parse(text);
    if (j && typeof j.error === "string") return j.error;
  } catch {
    // not JSON: the status says enough
  }
  return `the server answered HTTP ${resp.status}${text && text.length < 200 ? `: ${text}` : ""}`;
}

function base64Utf8(text) {
  const bytes = new TextEncoder().encode(text);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

/**
 * A snapshot -> the .pt file: {bytes: Uint8Array, filename, params_sha256}.
 * Throws CheckpointError with the server's words.
 */
export async function exportCheckpoint(snapshot, { base = "" } = {}) {
  const blob = await encodeState(snapshot);
  let resp;
  try {
    const headers = { "Content-Type": "application/octet-stream" };
    // a text model's vocabulary (the server checks it against the model and writes it in the .pt)
    if (typeof snapshot.vocab === "string") headers["X-Daisy-Vocab"] = base64Utf8(JSON.stringify(snapshot.vocab));
    resp = await fetch(`${base}/checkpoint/export`, { method: "POST", body: blob, headers });
  } catch (err) {
    throw new CheckpointError(`cannot reach the server to make the .pt: ${err.message}`);
  }
  if (!resp.ok) throw new CheckpointError(await serverError(resp));
  const bytes = new Uint8Array(await resp.arrayBuffer());
  const m = /filename="([^"]+)"/.exec(resp.headers.get("Content-Disposition") || "");
  return { bytes, filename: m ? m[1] : checkpointName("run", snapshot.step),
    params_sha256: resp.headers.get("X-Daisy-Params-Sha256") };
}

/**
 * A .pt file's bytes -> its checked state (decodeState's shape). With `expected` (the run's
 * identity) the server refuses a file of another run, naming what differs. Throws
 * CheckpointError with the server's words; nothing is changed anywhere.
 */
export async function importCheckpoint(bytes, expected = null, { base = "" } = {}) {
  const headers = { "Content-Type": "application/octet-stream" };
  if (expected) headers["X-Daisy-Expected-Identity"] = base64Utf8(JSON.stringify(expected));
  let resp;
  try {
    resp = await fetch(`${base}/checkpoint/import`, { method: "POST", body: bytes, headers });
  } catch (err) {
    throw new CheckpointError(`cannot reach the server to check the file: ${err.message}`);
  }
  if (!resp.ok) throw new CheckpointError(await serverError(resp));
  return decodeState(new Uint8Array(await resp.arrayBuffer()));
}

/** The run settings (the page's form fields) an identity was made with, what mesh.start
 *  takes: `layers` is the --layers items (hidden widths, and for an image model convN /
 *  convNkK / pool: spec.js parseLayers of layersText), `hidden` the first width of a dense
 *  model (null for a model with convolutions or pools), and the image recipe's fields. */
export function settingsOf(identity) {
  const hp = identity.hyper || {};
  const text = layersText(identity.model || { layers: [] });
  const layers = text ? text.split(",").map((t) => (/^[0-9]+$/.test(t) ? Number(t) : t)) : null;
  const dense = layers && layers.every((t) => typeof t === "number");
  const out = { task: identity.task, seed: hp.seed, batch: hp.batch, micro_batch: hp.micro_batch, lr: hp.lr,
    hidden: dense ? layers[0] : null, layers };
  for (const k of RECIPE_FIELDS) out[k] = hp[k] ?? 0;
  for (const k of LOCAL_FIELDS) if (k in hp) out[k] = hp[k]; // a local-steps run's (absent: synchronous)
  const input = identity.model?.input;
  if (identity.task === "text" && input?.kind === "tokens") out.context = input.dim; // --context
  return out;
}

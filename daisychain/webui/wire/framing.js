// Framing, one of the three parts of the data-channel wire format (frames.js puts them
// together; JS mirror of daisychain/peer/framing.py; docs/MESH.md documents every field):
// a message <-> frames, the header, the meta JSON (non-finite numbers refused), the
// per-channel Reassembler.
//
// Frame: 36-byte little-endian header (magic "DC", version 1, type, run id (8 raw bytes),
// step u32, message number u32, tensor u16 (0xFFFF: whole vector), codec u8, reserved u8,
// chunk index u32, chunk count u32, payload length u32), then at most 65500 payload bytes.
// A message's payloads, concatenated: u32 meta length | meta JSON (UTF-8) | body.

import { HYPER_FLOATS } from "../engine/spec.js";
import { canonicalJson } from "../engine/trainer.js";

export const MAGIC0 = 0x44; // "D"
export const MAGIC1 = 0x43; // "C"
export const VERSION = 1;
export const HEADER_SIZE = 36;
export const MAX_FRAME = 64 * 1024;
export const MAX_CHUNK = MAX_FRAME - HEADER_SIZE;
export const MAX_MESSAGE = 64 * 1024 * 1024;
export const WHOLE = 0xffff;
export const FrameType = Object.freeze({ CONTROL: 1, CONTRIB: 2, TOTAL: 3, STATE: 4, DATA: 5, RING: 6 });
export const Codec = Object.freeze({ NONE: 0, NARROW: 1, VARINT: 2, NARROW_Z: 3, VARINT_Z: 4, RAW: 5 });

export class FrameError extends Error {
  constructor(message) { super(message); this.name = "FrameError"; }
}


const utf8 = new TextEncoder();
// Hyperparameter floats are written as Python writes them (0.0, not 0), so a Python peer
// rebuilds the identical run identity (and run id) from an identity a tab announces.
const FLOAT_KEYS = new Set(HYPER_FLOATS);
const fromUtf8 = new TextDecoder("utf-8", { fatal: true });

function runBytes(runId) {
  const out = new Uint8Array(8);
  if (!runId) return out;
  if (!/^[0-9a-f]{16}$/.test(runId)) throw new FrameError(`run id ${runId.slice(0, 20)} is not 16 hex digits`);
  for (let i = 0; i < 8; i++) out[i] = parseInt(runId.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** One message -> frames (Uint8Array each). */
export function encodeFrames({ type, runId, step, meta, body = new Uint8Array(0), codec = 0, tensor = WHOLE }, msgNo) {
  const m = utf8.encode(canonicalJson(meta, FLOAT_KEYS));
  const payload = new Uint8Array(4 + m.length + body.length);
  new DataView(payload.buffer).setUint32(0, m.length, true);
  payload.set(m, 4);
  payload.set(body, 4 + m.length);
  if (payload.length > MAX_MESSAGE) throw new FrameError(`message of ${payload.length} bytes is over ${MAX_MESSAGE}`);
  const count = Math.max(1, Math.ceil(payload.length / MAX_CHUNK));
  const rid = runBytes(runId);
  const out = [];
  for (let i = 0; i < count; i++) {
    const part = payload.subarray(i * MAX_CHUNK, (i + 1) * MAX_CHUNK);
    const f = new Uint8Array(HEADER_SIZE + part.length);
    const dv = new DataView(f.buffer);
    f[0] = MAGIC0; f[1] = MAGIC1; f[2] = VERSION; f[3] = type;
    f.set(rid, 4);
    dv.setUint32(12, step >>> 0, true);
    dv.setUint32(16, msgNo >>> 0, true);
    dv.setUint16(20, tensor, true);
    f[22] = codec; f[23] = 0;
    dv.setUint32(24, i, true);
    dv.setUint32(28, count, true);
    dv.setUint32(32, part.length, true);
    f.set(part, HEADER_SIZE);
    out.push(f);
  }
  return out;
}

export function decodeFrame(data) {
  if (data.length < HEADER_SIZE) throw new FrameError(`frame of ${data.length} bytes is shorter than the header`);
  if (data.length > MAX_FRAME) throw new FrameError(`frame of ${data.length} bytes is over ${MAX_FRAME}`);
  const dv = new DataView(data.buffer, data.byteOffset, data.byteLength);
  if (data[0] !== MAGIC0 || data[1] !== MAGIC1) throw new FrameError("not a DaisyChain frame (bad magic)");
  if (data[2] !== VERSION) throw new FrameError(`frame version ${data[2]}; this tab speaks ${VERSION}: reload`);
  const type = data[3];
  if (type < 1 || type > 6) throw new FrameError(`unknown frame type ${type}`);
  const rid = data.subarray(4, 12);
  const runId = rid.some((b) => b) ? [...rid].map((b) => b.toString(16).padStart(2, "0")).join("") : "";
  const index = dv.getUint32(24, true);
  const count = dv.getUint32(28, true);
  const length = dv.getUint32(32, true);
  if (count < 1 || index >= count || count * MAX_CHUNK > MAX_MESSAGE + MAX_CHUNK) throw new FrameError(`bad chunk ${index} of ${count}`);
  if (length !== data.length - HEADER_SIZE) throw new FrameError("frame length field does not match");
  return { type, runId, step: dv.getUint32(12, true), msg: dv.getUint32(16, true), tensor: dv.getUint16(20, true),
    codec: data[22], index, count, payload: data.subarray(HEADER_SIZE) };
}

/** JSON.parse reviver: a number that is not finite (`1e999` parses to Infinity) is refused,
 * as frames.py refuses it, so no non-finite value gets further. */
function finiteOnly(key, value) {
  if (typeof value === "number" && !Number.isFinite(value)) {
    throw new FrameError("meta holds a number that is not finite");
  }
  return value;
}

export class Reassembler {
  constructor() { this.parts = []; this.head = null; }

  /** One frame in; the message {type, runId, step, meta, body, codec} when complete. */
  feed(data) {
    const f = decodeFrame(data);
    if (f.index === 0) {
      if (this.head) throw new FrameError(`message ${this.head.msg} was cut off by message ${f.msg}`);
      this.head = f;
      this.parts = [];
    } else if (!this.head || f.msg !== this.head.msg || f.index !== this.parts.length || f.count !== this.head.count) {
      throw new FrameError(`chunk ${f.index} of message ${f.msg} out of order`);
    }
    this.parts.push(f.payload.slice());
    if (this.parts.length < f.count) return null;
    const head = this.head;
    const total = this.parts.reduce((s, p) => s + p.length, 0);
    const payload = new Uint8Array(total);
    let o = 0;
    for (const p of this.parts) { payload.set(p, o); o += p.length; }
    this.head = null;
    this.parts = [];
    if (payload.length < 4) throw new FrameError("message payload lacks its meta length");
    const n = new DataView(payload.buffer).getUint32(0, true);
    if (4 + n > payload.length) throw new FrameError(`meta length ${n} does not fit the message`);
    let meta;
    try {
      meta = JSON.parse(fromUtf8.decode(payload.subarray(4, 4 + n)), finiteOnly);
    } catch (err) {
      if (err instanceof FrameError) throw err;
      throw new FrameError(`meta is not JSON: ${err.message}`);
    }
    if (!meta || typeof meta !== "object" || Array.isArray(meta)) throw new FrameError("meta must be a JSON object");
    return { type: head.type, runId: head.runId, step: head.step, meta, body: payload.subarray(4 + n), codec: head.codec, tensor: head.tensor };
  }
}

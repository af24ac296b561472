// The data-channel wire format, JS mirror of daisychain/peer/frames.py (the one Python
// module of this channel; docs/MESH.md documents every field). Encode/decode only: no DOM,
// no RTCPeerConnection.
//
// Frame: 36-byte little-endian header (magic "DC", version 1, type, run id (8 raw bytes),
// step u32, message number u32, tensor u16 (0xFFFF: whole vector), codec u8, reserved u8,
// chunk index u32, chunk count u32, payload length u32), then at most 65500 payload bytes.
// A message's payloads, concatenated: u32 meta length | meta JSON (UTF-8) | body.
// Integer vectors (exact integers below 2**53, held in Float64Array) are sent NARROW or
// VARINT, whichever is smaller (zlib variants need the async CompressionStream, so this
// encoder leaves them to Python); every codec is decoded.

export const MAGIC0 = 0x44; // "D"
export const MAGIC1 = 0x43; // "C"
export const VERSION = 1;
export const HEADER_SIZE = 36;
export const MAX_FRAME = 64 * 1024;
export const MAX_CHUNK = MAX_FRAME - HEADER_SIZE;
export const MAX_MESSAGE = 64 * 1024 * 1024;
export const WHOLE = 0xffff;
export const FrameType = Object.freeze({ CONTROL: 1, CONTRIB: 2, TOTAL: 3, STATE: 4, DATA: 5 });
export const Codec = Object.freeze({ NONE: 0, NARROW: 1, VARINT: 2, NARROW_Z: 3, VARINT_Z: 4, RAW: 5 });

export class FrameError extends Error {
  constructor(message) { super(message); this.name = "FrameError"; }
}

import { canonicalJson } from "./engine/trainer.js";
import { HYPER_FLOATS } from "./engine/spec.js";

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
  if (type < 1 || type > 5) throw new FrameError(`unknown frame type ${type}`);
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

// -- integer vectors (values are exact integers in a Float64Array) --------------------------

const LIMIT = 2 ** 53;

export function encodeIntsRaw(v) {
  const out = new Uint8Array(v.length * 8);
  const dv = new DataView(out.buffer);
  for (let i = 0; i < v.length; i++) {
    if (!Number.isSafeInteger(v[i])) throw new FrameError(`integer ${i} is not below 2**53`);
    dv.setBigInt64(8 * i, BigInt(v[i]), true);
  }
  return out;
}

function ctzCommon(v, a, b) {
  // trailing zero bits shared by every value of v[a:b] (0 when all are zero), capped at 62
  let shift = 62;
  let any = false;
  for (let i = a; i < b; i++) {
    let x = Math.abs(v[i]);
    if (x === 0) continue;
    any = true;
    let s = 0;
    while (s < shift && x % 2 === 0) { x /= 2; s++; }
    shift = s;
    if (shift === 0) break;
  }
  return any ? shift : 0;
}

function segmentsEncode(v, bounds, varint) {
  const heads = [];
  const bodies = [];
  let size = 0;
  for (let s = 0; s + 1 < bounds.length; s++) {
    const a = bounds[s], b = bounds[s + 1];
    const shift = ctzCommon(v, a, b);
    const scale = 2 ** shift;
    let width = 0, lo = 0, hi = 0;
    for (let i = a; i < b; i++) { const x = v[i] / scale; if (x < lo) lo = x; if (x > hi) hi = x; }
    let body = new Uint8Array(0);
    if (lo === 0 && hi === 0) {
      width = 0;
    } else if (varint) {
      width = 255;
      const out = [];
      for (let i = a; i < b; i++) {
        const x = v[i] / scale;
        let z = x >= 0 ? 2 * x : -2 * x - 1; // zig-zag, exact below 2**53
        while (z >= 128) { out.push((z % 128) | 0x80); z = Math.floor(z / 128); }
        out.push(z);
      }
      body = Uint8Array.from(out);
    } else {
      const m = Math.max(hi, -(lo + 1));
      width = m < 2 ** 7 ? 1 : m < 2 ** 15 ? 2 : m < 2 ** 31 ? 4 : 8;
      body = new Uint8Array((b - a) * width);
      const dv = new DataView(body.buffer);
      for (let i = a; i < b; i++) {
        const x = v[i] / scale, o = (i - a) * width;
        if (width === 1) dv.setInt8(o, x);
        else if (width === 2) dv.setInt16(o, x, true);
        else if (width === 4) dv.setInt32(o, x, true);
        else dv.setBigInt64(o, BigInt(x), true);
      }
    }
    const h = new Uint8Array(6);
    new DataView(h.buffer).setUint32(0, b - a, true);
    h[4] = shift; h[5] = width;
    heads.push(h);
    bodies.push(body);
    size += 6 + body.length;
  }
  const out = new Uint8Array(4 + size);
  new DataView(out.buffer).setUint32(0, bounds.length - 1, true);
  let o = 4;
  for (const h of heads) { out.set(h, o); o += 6; }
  for (const p of bodies) { out.set(p, o); o += p.length; }
  return out;
}

/** The smaller of NARROW and VARINT (or RAW if smaller): {codec, body}. ``bounds``: segment
 *  boundaries [0, n0, n0 + n1, ..., v.length] (one per canonical tensor), or null. */
export function encodeInts(v, bounds = null, codecs = [Codec.RAW, Codec.NARROW, Codec.VARINT]) {
  for (let i = 0; i < v.length; i++) {
    if (!Number.isSafeInteger(v[i])) throw new FrameError(`integer ${i} is not an integer below 2**53`);
  }
  const b = bounds && bounds.length ? [...bounds] : [0, v.length];
  if (b[0] !== 0 || b[b.length - 1] !== v.length) throw new FrameError("segment bounds must run from 0 to the vector length");
  let best = null;
  for (const c of codecs) {
    const body = c === Codec.RAW ? encodeIntsRaw(v) : c === Codec.NARROW ? segmentsEncode(v, b, false)
      : c === Codec.VARINT ? segmentsEncode(v, b, true) : null;
    if (body === null) throw new FrameError(`this encoder does not write codec ${c}`);
    if (best === null || body.length < best.body.length) best = { codec: c, body };
  }
  return best;
}

/** Inflate a zlib body, reading at most MAX_MESSAGE bytes of output (as frames.py caps it):
 * a small "zip bomb" is refused once its output passes the cap, never held in memory. */
async function inflate(bytes) {
  const reader = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate")).getReader();
  const parts = [];
  let total = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      total += value.length;
      if (total > MAX_MESSAGE) {
        await reader.cancel().catch(() => {});
        throw new FrameError(`compressed integer body is too large (inflates past ${MAX_MESSAGE} bytes)`);
      }
      parts.push(value);
    }
  } catch (err) {
    if (err instanceof FrameError) throw err;
    throw new FrameError(`compressed integer body is corrupt: ${err.message}`);
  }
  const out = new Uint8Array(total);
  let o = 0;
  for (const p of parts) { out.set(p, o); o += p.length; }
  return out;
}

export async function decodeInts(codec, body, size = null) {
  let out;
  if (codec === Codec.RAW) {
    if (body.length % 8) throw new FrameError("raw int64 body length is not a multiple of 8");
    const dv = new DataView(body.buffer, body.byteOffset, body.byteLength);
    out = new Float64Array(body.length / 8);
    for (let i = 0; i < out.length; i++) {
      const v = dv.getBigInt64(8 * i, true);
      if (v >= 9007199254740992n || v <= -9007199254740992n) throw new FrameError("an integer vector value is not below 2**53");
      out[i] = Number(v);
    }
  } else if (codec >= 1 && codec <= 4) {
    if (body.length < 4) throw new FrameError("integer body lacks its segment count");
    const nseg = new DataView(body.buffer, body.byteOffset, 4).getUint32(0, true);
    let rest = body.subarray(4);
    if (codec === Codec.NARROW_Z || codec === Codec.VARINT_Z) rest = await inflate(rest);
    const dv = new DataView(rest.buffer, rest.byteOffset, rest.byteLength);
    if (nseg * 6 > rest.length) throw new FrameError(`${nseg} segment headers do not fit the body`);
    const heads = [];
    let total = 0;
    for (let i = 0; i < nseg; i++) {
      const h = { length: dv.getUint32(6 * i, true), shift: rest[6 * i + 4], width: rest[6 * i + 5] };
      total += h.length;
      heads.push(h);
    }
    if (total > MAX_MESSAGE) throw new FrameError("integer vector too long");
    out = new Float64Array(total);
    let pos = 6 * nseg;
    let k = 0;
    for (const { length, shift, width } of heads) {
      if (shift > 62) throw new FrameError(`segment shift ${shift} is over 62`);
      const scale = 2 ** shift;
      for (let i = 0; i < length; i++) {
        let v;
        if (width === 0) v = 0;
        else if (width === 255) {
          let z = 0n;
          let s = 0n;
          for (let b = 0; ; b++) {
            if (pos >= rest.length || b >= 8) throw new FrameError("varint is cut short or too long");
            const byte = rest[pos++];
            z |= BigInt(byte & 0x7f) << s;
            s += 7n;
            if (!(byte & 0x80)) break;
          }
          v = Number((z >> 1n) ^ -(z & 1n));
        } else if (width === 1 || width === 2 || width === 4 || width === 8) {
          if (pos + width > rest.length) throw new FrameError("narrow segment is cut short");
          v = width === 1 ? dv.getInt8(pos) : width === 2 ? dv.getInt16(pos, true)
            : width === 4 ? dv.getInt32(pos, true) : Number(dv.getBigInt64(pos, true));
          pos += width;
        } else {
          throw new FrameError(`segment width ${width} is not 0, 1, 2, 4, 8 or 255`);
        }
        v *= scale;
        if (!(Math.abs(v) < LIMIT)) throw new FrameError("an integer vector value is not below 2**53");
        out[k++] = v;
      }
    }
    if (pos !== rest.length) throw new FrameError(`${rest.length - pos} stray bytes after the segments`);
  } else {
    throw new FrameError(`codec ${codec} is not an integer-vector codec`);
  }
  if (size !== null && out.length !== size) throw new FrameError(`integer vector has ${out.length} values, expected ${size}`);
  return out;
}

// -- run messages ------------------------------------------------------------------------------

function f64Bytes(arrays, tail) {
  const n = arrays.reduce((s, a) => s + a.length, 0) + tail.length;
  const out = new Uint8Array(8 * n);
  const dv = new DataView(out.buffer);
  let k = 0;
  for (const a of [...arrays, tail]) for (let i = 0; i < a.length; i++) dv.setFloat64(8 * k++, a[i], true);
  return out;
}

/** A run message object (runpeer.js) -> frames. */
export function encode(msg, runId, bounds, nextMsgNo) {
  let m;
  if (msg.T === "contrib") {
    const { codec, body } = encodeInts(msg.ints, bounds);
    m = { type: FrameType.CONTRIB, runId, step: msg.step, codec, body,
      meta: { term: msg.term, task: msg.task, micro: [...msg.micro], loss: msg.loss, correct: msg.correct } };
  } else if (msg.T === "total") {
    const { codec, body } = encodeInts(msg.ints, bounds);
    m = { type: FrameType.TOTAL, runId, step: msg.step, codec, body,
      meta: { term: msg.term, contributors: msg.contributors.map(([p, n]) => [p, n]), loss: msg.loss, params_sha256: msg.params_sha256 } };
    // the receiver's tasks of the next step ride on its total (run.py / runpeer.js _commit)
    if (msg.tasks && msg.tasks.length) m.meta.tasks = msg.tasks.map((t) => ({ task: t.task, peer: t.peer, micro: [...t.micro] }));
  } else if (msg.T === "state") {
    m = { type: FrameType.STATE, runId, step: msg.step, meta: { params_sha256: msg.params_sha256 },
      body: f64Bytes([msg.theta, msg.m, msg.v], [msg.b1t, msg.b2t]) };
  } else if (msg.T === "data") {
    m = { type: FrameType.DATA, runId, step: 0, meta: { fingerprint: msg.fingerprint }, body: msg.data };
  } else {
    const meta = { t: msg.T };
    for (const [k, v] of Object.entries(msg)) if (k !== "T" && k !== "step") meta[k] = v;
    m = { type: FrameType.CONTROL, runId, step: msg.step ?? 0, meta };
  }
  return encodeFrames(m, nextMsgNo());
}

const need = (cond, what) => { if (!cond) throw new FrameError(what); };
const isInt = (v) => Number.isInteger(v) && v >= 0 && v <= 0xffffffff;
const isHex = (v, n = 64) => typeof v === "string" && v.length === n && /^[0-9a-f]+$/.test(v);
const isMicro = (v) => Array.isArray(v) && v.length > 0 && v.length <= 1 << 20
  && v.every((j, i) => Number.isInteger(j) && j >= 0 && j < 2 ** 31 && (i === 0 || j > v[i - 1]));
// the string and list limits of frames.py (_M.str / _M.list)
const isNum = (v) => typeof v === "number" && Math.abs(v) <= 1e300; // frames.py _M.num
const isStr = (v, n = 256) => typeof v === "string" && v.length <= n;
const isList = (v, n = 1 << 16) => Array.isArray(v) && v.length <= n;
const isTasks = (v) => isList(v) && v.every((x) => x && typeof x === "object" && isInt(x.task) && isStr(x.peer, 64) && isMicro(x.micro));

/** A reassembled message -> a run message object; async (compressed bodies). */
export async function fromMessage(m, size = null) {
  const meta = m.meta;
  if (m.type === FrameType.CONTRIB) {
    need(isInt(meta.term) && isInt(meta.task) && isMicro(meta.micro) && isNum(meta.loss) && isInt(meta.correct), "contrib: bad meta");
    return { T: "contrib", term: meta.term, step: m.step, task: meta.task, micro: meta.micro, loss: meta.loss,
      correct: meta.correct, ints: await decodeInts(m.codec, m.body, size) };
  }
  if (m.type === FrameType.TOTAL) {
    need(isInt(meta.term) && isList(meta.contributors) && isNum(meta.loss) && isHex(meta.params_sha256), "total: bad meta");
    need(meta.contributors.every((c) => Array.isArray(c) && c.length === 2 && isStr(c[0], 64) && Number.isSafeInteger(c[1]) && c[1] >= 0), "total: bad contributors");
    need(meta.tasks === undefined || isTasks(meta.tasks), "total: bad tasks");
    return { T: "total", term: meta.term, step: m.step, contributors: meta.contributors, loss: meta.loss,
      params_sha256: meta.params_sha256, ints: await decodeInts(m.codec, m.body, size), tasks: meta.tasks ?? [] };
  }
  if (m.type === FrameType.STATE) {
    need(size !== null, "state: no run to load it into");
    need(m.body.length === 24 * size + 16, `state of ${m.body.length} bytes does not hold ${size} parameters`);
    need(isHex(meta.params_sha256), "state: bad params_sha256");
    const dv = new DataView(m.body.buffer, m.body.byteOffset, m.body.byteLength);
    const read = (k) => Float64Array.from({ length: size }, (_, i) => dv.getFloat64(8 * (k * size + i), true));
    const theta = read(0);
    const mm = read(1);
    const v = read(2);
    for (const a of [theta, mm, v]) need(a.every(Number.isFinite), "state holds non-finite values");
    return { T: "state", step: m.step, params_sha256: meta.params_sha256, theta, m: mm, v,
      b1t: dv.getFloat64(24 * size, true), b2t: dv.getFloat64(24 * size + 8, true) };
  }
  if (m.type === FrameType.DATA) {
    need(isHex(meta.fingerprint), "data: bad fingerprint");
    return { T: "data", fingerprint: meta.fingerprint, data: m.body.slice() };
  }
  const t = meta.t;
  const out = { T: t, step: m.step };
  const copy = (keys) => { for (const k of keys) out[k] = meta[k]; };
  if (t === "run") {
    need(meta.identity && typeof meta.identity === "object" && !Array.isArray(meta.identity) && isHex(meta.run_id, 16)
      && isInt(meta.steps) && isInt(meta.term) && isHex(meta.params_sha256) && isStr(meta.coordinator, 64), "run: bad meta");
    // spot-checks (run.py): absent means none (an older peer), as frames.py reads it
    need(meta.verify_rate === undefined || (typeof meta.verify_rate === "number" && meta.verify_rate >= 0 && meta.verify_rate <= 1), "run: bad verify_rate");
    need(meta.strikes === undefined || (Number.isInteger(meta.strikes) && meta.strikes >= 1 && meta.strikes <= 1000), "run: bad strikes");
    copy(["identity", "run_id", "steps", "term", "params_sha256", "coordinator"]);
    out.verify_rate = meta.verify_rate ?? 0.0;
    out.strikes = meta.strikes ?? 3;
  } else if (t === "ready") {
    need(isInt(meta.term) && typeof meta.capacity === "number" && meta.capacity >= 1e-3 && meta.capacity <= 1e9
      && isStr(meta.kind, 16) && isHex(meta.params_sha256), "ready: bad meta");
    copy(["term", "capacity", "kind", "params_sha256"]);
  } else if (t === "refuse") {
    need(isInt(meta.term) && isList(meta.reasons, 64) && meta.reasons.every((r) => isStr(r, 1000)), "refuse: bad meta");
    copy(["term", "reasons"]);
  } else if (t === "assign") {
    need(isInt(meta.term) && isTasks(meta.tasks), "assign: bad meta");
    copy(["term", "tasks"]);
  } else if (t === "sync") {
    need(isInt(meta.term) && isHex(meta.params_sha256) && isStr(meta.reason, 1000), "sync: bad meta");
    copy(["term", "params_sha256", "reason"]);
  } else if (t === "data_request") {
    need(isHex(meta.fingerprint), "data_request: bad meta");
    copy(["fingerprint"]);
  } else if (t === "restore") {
    need(isInt(meta.term) && isHex(meta.params_sha256), "restore: bad meta");
    copy(["term", "params_sha256"]);
  } else if (t === "end") {
    need(isInt(meta.term) && isHex(meta.params_sha256), "end: bad meta");
    copy(["term", "params_sha256"]);
  } else {
    throw new FrameError(`unknown control message ${String(t).slice(0, 32)}`);
  }
  return out;
}

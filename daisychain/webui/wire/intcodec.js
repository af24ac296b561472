// Integer-vector codecs (CONTRIB / TOTAL bodies), one of the three parts of the wire format
// (frames.js; JS mirror of daisychain/peer/intcodec.py). Values are exact integers below
// 2**53, held in Float64Array; they are sent NARROW or VARINT, whichever is smaller (zlib
// variants need the async CompressionStream, so this encoder leaves them to Python); every
// codec is decoded, with inflate capped at MAX_MESSAGE.

import { Codec, FrameError, MAX_MESSAGE } from "./framing.js";

// -- integer vectors (values are exact integers in a Float64Array) --------------------------

const LIMIT = 2 ** 53;
// intcodec.py MAX_SEGMENTS / HEAD_BYTES / VALUE_BYTES: the most segments a body may declare
// (checked on its first four bytes, before anything is inflated or allocated), the bytes of a
// segment header, and the most bytes one value's payload can take.
export const MAX_SEGMENTS = 8192;
const HEAD_BYTES = 6;
const VALUE_BYTES = 8;

export function encodeIntsRaw(v) {
  const out = new Uint8Array(v.length * 8);
  const dv = new DataView(out.buffer);
  for (let i = 0; i < v.length; i++) {
    if (!Number.isSafeInteger(v[i])) throw new FrameError(`integer ${i} is not below 2**53`);
    dv.setBigInt64(8 * i, BigInt(v[i]), true);
  }
  return out;
}

const TWO32 = 2 ** 32;

function ctz32(x) {
  // trailing zero bits of a nonzero 32-bit word
  return 31 - Math.clz32(x & -x);
}

function ctzCommon(v, a, b) {
  // trailing zero bits shared by every value of v[a:b] (0 when all are zero), capped at 62:
  // those of the OR of the values' magnitudes, taken as two words (exact below 2**53)
  let lo = 0;
  let hi = 0;
  for (let i = a; i < b; i++) {
    const x = Math.abs(v[i]);
    if (x < TWO32) lo |= x;
    else {
      const h = Math.floor(x / TWO32);
      lo |= x - h * TWO32;
      hi |= h;
    }
    if (lo & 1) return 0;
  }
  if (lo) return ctz32(lo);
  if (hi) return Math.min(62, 32 + ctz32(hi));
  return 0;
}

// one segment's plan, before a byte is written: its common shift, its range after the shift,
// and what each codec's payload would take (NARROW: its width; VARINT: the zig-zag varint bytes)
function segmentPlan(v, a, b) {
  const shift = ctzCommon(v, a, b);
  const scale = 2 ** shift;
  let lo = 0, hi = 0, vbytes = 0;
  for (let i = a; i < b; i++) {
    const x = v[i] / scale;
    if (x < lo) lo = x;
    if (x > hi) hi = x;
    const z = x >= 0 ? 2 * x : -2 * x - 1; // zig-zag, exact below 2**53
    vbytes += z < 2 ** 7 ? 1 : z < 2 ** 14 ? 2 : z < 2 ** 21 ? 3 : z < 2 ** 28 ? 4 : z < 2 ** 35 ? 5
      : z < 2 ** 42 ? 6 : z < 2 ** 49 ? 7 : 8;
  }
  const zero = lo === 0 && hi === 0;
  const m = Math.max(hi, -(lo + 1));
  const width = zero ? 0 : m < 2 ** 7 ? 1 : m < 2 ** 15 ? 2 : m < 2 ** 31 ? 4 : 8;
  return { a, b, shift, scale, zero, width, vbytes: zero ? 0 : vbytes };
}

function varintBody(v, p) {
  const out = new Uint8Array(p.vbytes);
  let o = 0;
  for (let i = p.a; i < p.b; i++) {
    const x = v[i] / p.scale;
    let z = x >= 0 ? 2 * x : -2 * x - 1; // zig-zag, exact below 2**53
    if (z < TWO32) { // 32-bit words: shifts
      z >>>= 0;
      while (z >= 128) { out[o++] = (z & 127) | 0x80; z >>>= 7; }
    } else {
      while (z >= 128) { out[o++] = (z % 128) | 0x80; z = Math.floor(z / 128); }
    }
    out[o++] = z;
  }
  return out;
}

function narrowBody(v, p) {
  const { a, b, scale, width } = p;
  const n = b - a;
  if (width === 1) {
    const t = new Int8Array(n);
    for (let i = 0; i < n; i++) t[i] = v[a + i] / scale;
    return new Uint8Array(t.buffer);
  }
  const body = new Uint8Array(n * width);
  const dv = new DataView(body.buffer);
  if (width === 2) for (let i = 0; i < n; i++) dv.setInt16(2 * i, v[a + i] / scale, true);
  else if (width === 4) for (let i = 0; i < n; i++) dv.setInt32(4 * i, v[a + i] / scale, true);
  else for (let i = 0; i < n; i++) dv.setBigInt64(8 * i, BigInt(v[a + i] / scale), true);
  return body;
}

// a NARROW or VARINT body from its segments' plans: the count, the heads, the payloads
function segmentsEncode(v, plans, varint) {
  const bodies = plans.map((p) => (p.zero ? new Uint8Array(0) : varint ? varintBody(v, p) : narrowBody(v, p)));
  const out = new Uint8Array(4 + 6 * plans.length + bodies.reduce((n, x) => n + x.length, 0));
  const dv = new DataView(out.buffer);
  dv.setUint32(0, plans.length, true);
  let o = 4;
  for (const p of plans) {
    dv.setUint32(o, p.b - p.a, true);
    out[o + 4] = p.shift;
    out[o + 5] = p.zero ? 0 : varint ? 255 : p.width;
    o += 6;
  }
  for (const x of bodies) { out.set(x, o); o += x.length; }
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
  // each codec's length is known from one pass over the values; only the smallest (the first
  // of `codecs` on a tie) is written
  const plans = [];
  for (let s = 0; s + 1 < b.length; s++) plans.push(segmentPlan(v, b[s], b[s + 1]));
  const heads = 4 + 6 * plans.length;
  let best = null;
  let bestLen = Infinity;
  for (const c of codecs) {
    const len = c === Codec.RAW ? 8 * v.length
      : c === Codec.NARROW ? heads + plans.reduce((n, p) => n + (p.b - p.a) * p.width, 0)
        : c === Codec.VARINT ? heads + plans.reduce((n, p) => n + p.vbytes, 0) : null;
    if (len === null) throw new FrameError(`this encoder does not write codec ${c}`);
    if (len < bestLen) { best = c; bestLen = len; }
  }
  const body = best === Codec.RAW ? encodeIntsRaw(v) : segmentsEncode(v, plans, best === Codec.VARINT);
  return { codec: best, body };
}

/** Inflate a zlib body, reading at most MAX_MESSAGE bytes of output (as frames.py caps it):
 * a small "zip bomb" is refused once its output passes the cap, never held in memory. */
async function inflate(bytes, cap = MAX_MESSAGE, nseg = 0) {
  const reader = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate")).getReader();
  const parts = [];
  let total = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      total += value.length;
      if (total > cap) {
        await reader.cancel().catch(() => {});
        throw new FrameError(cap < MAX_MESSAGE
          ? `compressed integer body is too large (inflates past ${cap} bytes, more than its ${nseg} segments can hold)`
          : `compressed integer body is too large (inflates past ${MAX_MESSAGE} bytes)`);
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

/**
 * intcodec.py decode_ints: `size` (if not null) is the expected length, else `maxSize` (if not
 * null) the most values the receiver takes (a ring chunk's). Every bound is checked from the
 * body's declared shape before anything it claims is allocated.
 */
export async function decodeInts(codec, body, size = null, maxSize = null) {
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
    if (nseg > MAX_SEGMENTS) throw new FrameError(`integer body declares ${nseg} segments (at most ${MAX_SEGMENTS})`);
    const values = size !== null ? size : maxSize;
    const cap = values === null ? MAX_MESSAGE : Math.min(MAX_MESSAGE, HEAD_BYTES * nseg + VALUE_BYTES * values);
    let rest = body.subarray(4);
    if (codec === Codec.NARROW_Z || codec === Codec.VARINT_Z) rest = await inflate(rest, cap, nseg);
    const dv = new DataView(rest.buffer, rest.byteOffset, rest.byteLength);
    if (nseg * HEAD_BYTES > rest.length) throw new FrameError(`${nseg} segment headers do not fit the body`);
    let total = 0;
    for (let i = 0; i < nseg; i++) total += dv.getUint32(HEAD_BYTES * i, true);
    if (total > MAX_MESSAGE) throw new FrameError("integer vector too long");
    // before anything the headers claim is made (a few bytes can claim millions of zeros)
    if (size !== null && total !== size) throw new FrameError(`integer vector has ${total} values, expected ${size}`);
    if (size === null && maxSize !== null && total > maxSize) throw new FrameError(`integer vector has ${total} values, more than ${maxSize}`);
    const heads = [];
    for (let i = 0; i < nseg; i++) {
      heads.push({ length: dv.getUint32(HEAD_BYTES * i, true), shift: rest[HEAD_BYTES * i + 4], width: rest[HEAD_BYTES * i + 5] });
    }
    out = new Float64Array(total);
    let pos = HEAD_BYTES * nseg;
    let k = 0;
    for (const { length, shift, width } of heads) {
      if (shift > 62) throw new FrameError(`segment shift ${shift} is over 62`);
      const scale = 2 ** shift;
      if (length === 0 || width === 0) { k += length; continue; } // zeros (out starts zeroed)
      if (width === 255) {
        for (let i = 0; i < length; i++) {
          // zig-zag LEB128 of at most 8 bytes: the first four bytes' 28 bits as an int, the rest
          // a Number, so the value is exact without BigInt (z >> 1 = hi * 2**27 + (lo >>> 1))
          let lo = 0, hi = 0, b = 0, byte;
          if (pos < rest.length && rest[pos] < 0x80) { // one byte: most of a step's values
            lo = rest[pos++];
            const v = ((lo & 1) ? -(lo >>> 1) - 1 : lo >>> 1) * scale;
            if (!(Math.abs(v) < LIMIT)) throw new FrameError("an integer vector value is not below 2**53");
            out[k++] = v;
            continue;
          }
          do {
            if (pos >= rest.length || b >= 8) throw new FrameError("varint is cut short or too long");
            byte = rest[pos++];
            if (b < 4) lo |= (byte & 0x7f) << (7 * b);
            else hi += (byte & 0x7f) * 2 ** (7 * (b - 4));
            b++;
          } while (byte & 0x80);
          const mag = hi * 2 ** 27 + (lo >>> 1);
          const v = ((lo & 1) ? -mag - 1 : mag) * scale;
          if (!(Math.abs(v) < LIMIT)) throw new FrameError("an integer vector value is not below 2**53");
          out[k++] = v;
        }
      } else if (width === 1 || width === 2 || width === 4 || width === 8) {
        const n = Math.min(length, Math.floor((rest.length - pos) / width));
        if (width === 1) for (let i = 0; i < n; i++) out[k++] = dv.getInt8(pos + i) * scale;
        else if (width === 2) for (let i = 0; i < n; i++) out[k++] = dv.getInt16(pos + 2 * i, true) * scale;
        else if (width === 4) for (let i = 0; i < n; i++) out[k++] = dv.getInt32(pos + 4 * i, true) * scale;
        else for (let i = 0; i < n; i++) out[k++] = Number(dv.getBigInt64(pos + 8 * i, true)) * scale;
        pos += n * width;
        for (let i = k - n; i < k; i++) {
          if (!(Math.abs(out[i]) < LIMIT)) throw new FrameError("an integer vector value is not below 2**53");
        }
        if (n < length) throw new FrameError("narrow segment is cut short");
      } else {
        throw new FrameError(`segment width ${width} is not 0, 1, 2, 4, 8 or 255`);
      }
    }
    if (pos !== rest.length) throw new FrameError(`${rest.length - pos} stray bytes after the segments`);
  } else {
    throw new FrameError(`codec ${codec} is not an integer-vector codec`);
  }
  if (size !== null && out.length !== size) throw new FrameError(`integer vector has ${out.length} values, expected ${size}`);
  if (size === null && maxSize !== null && out.length > maxSize) throw new FrameError(`integer vector has ${out.length} values, more than ${maxSize}`);
  return out;
}

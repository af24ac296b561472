// The image task's shift augmentation and learning-rate schedule, line for line
// daisychain/engine/augment.py (the algorithm: docs/DATA.md). Integer draws from prng.js;
// the schedule uses + - * / only, so it gives the same float64 bits as Python.

import { u32 } from "./prng.js";

export const STREAM_AUGMENT = 1 << 22; // + step

/** [dx, dy] (Int32Array each) for the given batch slots of a step. */
export function shifts(seed, step, slots, shift) {
  const r = 2 * shift + 1;
  const dx = new Int32Array(slots.length);
  const dy = new Int32Array(slots.length);
  for (let i = 0; i < slots.length; i++) {
    const u = u32(seed, STREAM_AUGMENT + step, 1, slots[i])[0]; // a non-negative integer < 2^32
    dx[i] = (u % r) - shift;
    dy[i] = ((u >>> 16) % r) - shift;
  }
  return [dx, dy];
}

/**
 * One image (Uint8Array, C*H*W channel-major) moved by (dx, dy) with zero fill:
 * out[c, y, x] = in[c, y - dy, x - dx] when inside, else 0.
 */
export function shiftImage(img, shape, dx, dy, out = new Uint8Array(img.length)) {
  const [c, h, w] = shape;
  for (let ch = 0; ch < c; ch++) {
    for (let y = 0; y < h; y++) {
      const sy = y - dy;
      for (let x = 0; x < w; x++) {
        const sx = x - dx;
        out[ch * h * w + y * w + x] =
          sy >= 0 && sy < h && sx >= 0 && sx < w ? img[ch * h * w + sy * w + sx] : 0;
      }
    }
  }
  return out;
}

/**
 * The samples of micro-batch `micro` of step `step`, augmented in place of a copy:
 * x (Uint8Array, micro_batch * C*H*W), slot of sample k = micro * micro_batch + k.
 */
export function augmentMicroBatch(x, shape, hp, step, micro) {
  const f = shape[0] * shape[1] * shape[2];
  const b = hp.micro_batch;
  const slots = Array.from({ length: b }, (_, k) => micro * b + k);
  const [dx, dy] = shifts(hp.seed, step, slots, hp.augment_shift);
  const out = new Uint8Array(x.length);
  for (let k = 0; k < b; k++) {
    shiftImage(x.subarray(k * f, (k + 1) * f), shape, dx[k], dy[k], out.subarray(k * f, (k + 1) * f));
  }
  return out;
}

/** The learning rate of Adam update t (0-based). */
export function lrAt(hp, t) {
  const lr = hp.lr;
  const w = hp.lr_warmup || 0;
  const d = hp.lr_decay_steps || 0;
  if (t < w) return lr * ((t + 1) / w);
  if (d > 0) {
    if (t >= d) return 0.0;
    return lr * ((d - t) / (d - w));
  }
  return lr;
}

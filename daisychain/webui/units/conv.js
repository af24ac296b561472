// The image units in plain JS: the data movement around the unit GEMM that makes a conv2d
// (im2col, col2im) and the 2x2 max pool, with the bytes the WGSL kernels
// (shaders/{im2col,col2im,maxpool,maxpool_back}.wgsl) produce. No products here: every
// product of a conv is a unit-GEMM product on the columns matrix.
//
// Layouts (one micro-batch of b samples; maps channel-major, index c*H*W + y*W + x):
//   im2col(a, b, {ci, k, h, w}):  a (b, ci*h*w) int8 -> cols (b*h*w, ci*k*k),
//     cols[s*h*w + y*w + x, c*k*k + dy*k + dx] = a[s, c, y+dy-p, x+dx-p], 0 outside; p = (k-1)/2
//   col2im(d, b, {ci, k, h, w}):  d (b*h*w, ci*k*k) int32 -> (b, ci*h*w) int32, the adjoint:
//     out[s, c, yy, xx] = sum over dy, dx of d[s*h*w + y*w + x, c*k*k + dy*k + dx] with
//     y = yy - dy + p, x = xx - dx + p inside the map (padding positions are dropped)
//   maxpool(a, b, {c, h, w}):  (b, c*h*w) int8 -> (b, c*(h>>1)*(w>>1)), max over each 2x2 window
//   maxpoolBack(g, a, b, {c, h, w}): g (b, c*(h>>1)*(w>>1)) int8 errors, a the pool's input ->
//     (b, c*h*w): g of a window at the window's first maximum in the order (0,0), (0,1),
//     (1,0), (1,1), 0 elsewhere (and on a dropped odd last row / column)

import { checkInt8Array, checkIntArray, INT32_MAX, INT32_MIN, UnitError } from "./units.js";

function dims(unit, geom, keys) {
  for (const key of keys) {
    const v = geom[key];
    if (!Number.isInteger(v) || v < 1 || v > 65535) throw new UnitError(`${unit}: ${key} must be an integer in [1, 65535], got ${v}`);
  }
  if (keys.includes("k") && geom.k % 2 !== 1) throw new UnitError(`${unit}: the kernel size must be odd, got ${geom.k}`);
}

export function checkLength(unit, name, x, len) {
  if (x.length !== len) throw new UnitError(`${unit}: ${name} has ${x.length} elements, the shape needs ${len}`);
}

/** Validate an im2col / col2im shape; returns {hw, kk, cols, p}. */
export function convLayout(unit, b, geom) {
  dims(unit, { b, ...geom }, ["b", "ci", "k", "h", "w"]);
  const { ci, k, h, w } = geom;
  return { hw: h * w, kk: k * k, cols: ci * k * k, p: (k - 1) >> 1 };
}

export function im2colArray(a, b, geom, out) {
  const { hw, kk, cols, p } = convLayout("im2col", b, geom);
  const { ci, k, h, w } = geom;
  checkLength("im2col", "a", a, b * ci * hw);
  checkInt8Array("im2col", "a", a);
  out = out || new Int32Array(b * hw * cols);
  checkLength("im2col", "out", out, b * hw * cols);
  let r = 0;
  for (let s = 0; s < b; s++) {
    for (let y = 0; y < h; y++) {
      for (let x = 0; x < w; x++, r++) {
        const row = r * cols;
        for (let c = 0; c < ci; c++) {
          const base = (s * ci + c) * hw;
          for (let dy = 0; dy < k; dy++) {
            const yy = y + dy - p;
            const j = row + c * kk + dy * k;
            for (let dx = 0; dx < k; dx++) {
              const xx = x + dx - p;
              out[j + dx] = yy >= 0 && yy < h && xx >= 0 && xx < w ? a[base + yy * w + xx] : 0;
            }
          }
        }
      }
    }
  }
  return out;
}

export function col2imArray(d, b, geom, out) {
  const { hw, kk, cols, p } = convLayout("col2im", b, geom);
  const { ci, k, h, w } = geom;
  checkLength("col2im", "d", d, b * hw * cols);
  checkIntArray("col2im", "d", d, INT32_MIN, INT32_MAX);
  out = out || new Int32Array(b * ci * hw);
  checkLength("col2im", "out", out, b * ci * hw);
  for (let s = 0; s < b; s++) {
    for (let c = 0; c < ci; c++) {
      for (let yy = 0; yy < h; yy++) {
        for (let xx = 0; xx < w; xx++) {
          let sum = 0;
          for (let dy = 0; dy < k; dy++) {
            const y = yy - dy + p;
            if (y < 0 || y >= h) continue;
            for (let dx = 0; dx < k; dx++) {
              const x = xx - dx + p;
              if (x < 0 || x >= w) continue;
              sum += d[(s * hw + y * w + x) * cols + c * kk + dy * k + dx];
            }
          }
          if (sum > INT32_MAX || sum < INT32_MIN) throw new UnitError("col2im: a sum left int32");
          out[(s * ci + c) * hw + yy * w + xx] = sum;
        }
      }
    }
  }
  return out;
}

/** Validate a pool shape; returns {hw, oh, ow}. */
export function poolLayout(unit, b, geom) {
  dims(unit, { b, ...geom }, ["b", "c", "h", "w"]);
  if (geom.h < 2 || geom.w < 2) throw new UnitError(`${unit}: a 2x2 pool needs a map of at least 2x2, got ${geom.h}x${geom.w}`);
  return { hw: geom.h * geom.w, oh: geom.h >> 1, ow: geom.w >> 1 };
}

export function maxpoolArray(a, b, geom, out) {
  const { hw, oh, ow } = poolLayout("maxpool", b, geom);
  const { c, w } = geom;
  checkLength("maxpool", "a", a, b * c * hw);
  checkInt8Array("maxpool", "a", a);
  out = out || new Int32Array(b * c * oh * ow);
  checkLength("maxpool", "out", out, b * c * oh * ow);
  let o = 0;
  for (let sc = 0; sc < b * c; sc++) {
    for (let Y = 0; Y < oh; Y++) {
      for (let X = 0; X < ow; X++, o++) {
        const i = sc * hw + 2 * Y * w + 2 * X;
        let m = a[i];
        if (a[i + 1] > m) m = a[i + 1];
        if (a[i + w] > m) m = a[i + w];
        if (a[i + w + 1] > m) m = a[i + w + 1];
        out[o] = m;
      }
    }
  }
  return out;
}

export function maxpoolBackArray(g, a, b, geom, out) {
  const { hw, oh, ow } = poolLayout("maxpoolBack", b, geom);
  const { c, w } = geom;
  checkLength("maxpoolBack", "g", g, b * c * oh * ow);
  checkLength("maxpoolBack", "a", a, b * c * hw);
  checkInt8Array("maxpoolBack", "g", g);
  checkInt8Array("maxpoolBack", "a", a);
  out = out || new Int32Array(b * c * hw);
  checkLength("maxpoolBack", "out", out, b * c * hw);
  out.fill(0);
  let o = 0;
  for (let sc = 0; sc < b * c; sc++) {
    for (let Y = 0; Y < oh; Y++) {
      for (let X = 0; X < ow; X++, o++) {
        const i = sc * hw + 2 * Y * w + 2 * X;
        let best = i; // first maximum in the order (0,0), (0,1), (1,0), (1,1)
        if (a[i + 1] > a[best]) best = i + 1;
        if (a[i + w] > a[best]) best = i + w;
        if (a[i + w + 1] > a[best]) best = i + w + 1;
        out[best] = g[o];
      }
    }
  }
  return out;
}

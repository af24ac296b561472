// The image side of "Try the model" (panels/try.js): a drawing, an image file or a test image
// made into one row of the model's input ([c, h, w], channels first, in the data's own pixel
// scale), and that row drawn back as the model sees it. No state; the DOM only through the
// canvases it is given.

/** A model input of `shape` from a drawing on an RGBA canvas of W x H: the ink's box,
 *  centred with a margin (as the digits of MNIST and sklearn are), averaged down to h x w.
 *  `ink(r, g, b)` is how much ink a canvas pixel holds (0..1); grey data gets ink * scale,
 *  RGB data each channel's value of the inked pixels, scaled. */
export function fromDrawing(rgba, W, H, [c, h, w], scale, rgb = false) {
  const inkAt = (i) => (rgb ? Math.max(rgba[i], rgba[i + 1], rgba[i + 2]) / 255 : 1 - rgba[i] / 255);
  let x0 = W; let y0 = H; let x1 = -1; let y1 = -1;
  for (let y = 0; y < H; y++) {
    for (let x = 0; x < W; x++) {
      if (inkAt((y * W + x) * 4) > (rgb ? 0.1 : 0.5)) { // any colour on black; dark on white
        if (x < x0) x0 = x;
        if (x > x1) x1 = x;
        if (y < y0) y0 = y;
        if (y > y1) y1 = y;
      }
    }
  }
  const out = new Float64Array(c * h * w);
  if (x1 < 0) return out;
  const n = Math.min(h, w);
  const margin = Math.max(1, Math.round(n / 7)); // 1 cell of 8 (digits), 4 of 28 (MNIST)
  const size = Math.max(x1 - x0, y1 - y0) + 1;
  const cell = size / (n - 2 * margin);
  const bx = (x0 + x1) / 2 - (cell * w) / 2;
  const by = (y0 + y1) / 2 - (cell * h) / 2;
  for (let cy = 0; cy < h; cy++) {
    for (let cx = 0; cx < w; cx++) {
      const sums = [0, 0, 0, 0];
      let count = 0;
      for (let y = Math.floor(by + cy * cell); y < by + (cy + 1) * cell; y++) {
        for (let x = Math.floor(bx + cx * cell); x < bx + (cx + 1) * cell; x++) {
          count++;
          if (x < 0 || y < 0 || x >= W || y >= H) continue;
          const i = (y * W + x) * 4;
          sums[0] += inkAt(i);
          for (let k = 0; k < 3; k++) sums[k + 1] += rgba[i + k] / 255;
        }
      }
      const p = cy * w + cx;
      if (c === 1) out[p] = Math.round((count ? sums[0] / count : 0) * scale);
      else for (let k = 0; k < c; k++) out[k * h * w + p] = Math.round((count ? sums[Math.min(k, 2) + 1] / count : 0) * scale);
    }
  }
  return out;
}

/** A model input of `shape` from a whole picture (RGBA of W x H, e.g. a dropped file drawn on
 *  a canvas): resized by area to h x w; for grey data the luminance, turned over when the
 *  picture is light on the whole and the data dark (MNIST's white ink on black).
 *  {input, inverted}. */
export function fromPicture(rgba, W, H, [c, h, w], scale, darkData = true) {
  const out = new Float64Array(c * h * w);
  const lum = (i) => (0.299 * rgba[i] + 0.587 * rgba[i + 1] + 0.114 * rgba[i + 2]) / 255;
  let mean = 0;
  for (let i = 0; i < W * H; i++) mean += lum(4 * i);
  mean /= Math.max(1, W * H);
  const inverted = c === 1 && darkData && mean > 0.5;
  for (let cy = 0; cy < h; cy++) {
    for (let cx = 0; cx < w; cx++) {
      const ya = Math.floor((cy * H) / h); const yb = Math.max(ya + 1, Math.floor(((cy + 1) * H) / h));
      const xa = Math.floor((cx * W) / w); const xb = Math.max(xa + 1, Math.floor(((cx + 1) * W) / w));
      const sums = [0, 0, 0, 0];
      let count = 0;
      for (let y = ya; y < Math.min(yb, H); y++) {
        for (let x = xa; x < Math.min(xb, W); x++) {
          const i = (y * W + x) * 4;
          sums[0] += lum(i);
          for (let k = 0; k < 3; k++) sums[k + 1] += rgba[i + k] / 255;
          count++;
        }
      }
      const p = cy * w + cx;
      const v = (k) => (count ? sums[k] / count : 0);
      if (c === 1) out[p] = Math.round((inverted ? 1 - v(0) : v(0)) * scale);
      else for (let k = 0; k < c; k++) out[k * h * w + p] = Math.round(v(Math.min(k, 2) + 1) * scale);
    }
  }
  return { input: out, inverted };
}

/** Draw a model input (channels first, 0..scale) on `canvas`, at its own size (w x h pixels):
 *  what the model is given, as the gallery shows a test image. */
export function drawInput(canvas, input, [c, h, w], scale) {
  canvas.width = w;
  canvas.height = h;
  const g = canvas.getContext("2d");
  const img = g.createImageData(w, h);
  const px = (k, p) => Math.max(0, Math.min(255, Math.round((input[k * h * w + p] * 255) / (scale || 1))));
  for (let p = 0; p < h * w; p++) {
    img.data[4 * p] = px(0, p);
    img.data[4 * p + 1] = px(c >= 3 ? 1 : 0, p);
    img.data[4 * p + 2] = px(c >= 3 ? 2 : 0, p);
    img.data[4 * p + 3] = 255;
  }
  g.putImageData(img, 0, 0);
}

// "Try the model": the replica this tab holds (during or after a run) or a downloaded
// checkpoint, put to use. Images (the image task at any size, grey or RGB, and the digits
// task's square images): draw on a canvas, drop an image file on it, or pick a test image in
// the gallery, and see the prediction with every class's probability, next to the input as
// the model sees it (its own h x w pixels). Text: type a prompt, sample a continuation from
// the character model. The forward passes run in the compute worker (worker/trainer_proxy.js
// WorkerTrainer.probs) on a copy of the parameters: the run is not touched.
//
//   const panel = new TryPanel(document.getElementById("try-panel"));
//   panel.use(trainer, "the run's model at step 120");   // a WorkerTrainer (has probs())

import { imageShape } from "../../engine/spec.js";
import { className } from "../ui_format.js";
import { drawInput, fromDrawing, fromPicture } from "./try_image.js";
import { bus } from "../../shell/bus.js";

const SIDE = 160; // the drawing canvas, CSS pixels

export class TryPanel {
  constructor(root) {
    // the model to try (page:try {trainer, label}) and a test row to try it on (page:try-row)
    bus.on("page:try", ({ trainer, label }) => this.use(trainer, label));
    bus.on("page:try-row", ({ row }) => this.tryRow(row));
    this.root = root;
    this.trainer = null;
    this.kind = null;
    this.busy = false;
    this.$ = (sel) => root.querySelector(sel);
    this._wireDrawing();
    this._wireText();
  }

  /** Show the panel for `trainer` (null hides it); `label` says which model it is. */
  use(trainer, label) {
    this.trainer = trainer && typeof trainer.probs === "function" ? trainer : null;
    this.root.hidden = false;
    if (!this.trainer) {
      this.kind = null;
      this.$(".try-image").hidden = true;
      this.$(".try-text").hidden = true;
      this.$(".try-none").hidden = false;
      this.$(".try-none").textContent = "No model yet: start a run, or try a downloaded checkpoint.";
      this.$(".try-which").textContent = "no model yet";
      return;
    }
    this.$(".try-none").textContent = "This model's data is neither images nor text: nothing to try by hand.";
    const ds = this.trainer.ds;
    this.shape = inputShape(this.trainer.spec, ds);
    this.kind = this.shape ? "image" : ds.meta && typeof ds.meta.vocab === "string" ? "text" : null;
    this.$(".try-image").hidden = this.kind !== "image";
    this.$(".try-text").hidden = this.kind !== "text";
    this.$(".try-none").hidden = this.kind !== null;
    this.$(".try-which").textContent = label;
    if (this.kind === "image") {
      const [c, h, w] = this.shape;
      this.rgb = c >= 3;
      this.scale = pixelScale(ds); // the data's pixel scale (sklearn digits: 0..16, images: 0..255)
      this.$(".try-colour-label").hidden = !this.rgb;
      this.$(".try-input-label").textContent = `what the model sees: ${w} × ${h}${this.rgb ? ", colour" : ""}`;
      this._clear();
      drawInput(this.$("canvas.try-input"), new Float64Array(c * h * w), this.shape, this.scale);
      this.$(".try-probs").replaceChildren();
      this.$(".try-answer").textContent = this._prompt();
    }
  }

  _prompt() {
    const [, h, w] = this.shape;
    return `Draw in the box (the model sees ${w} × ${h} pixels), drop an image file on it` +
      (this.trainer?.ds?.kind === "image" ? ", or pick a test image in the gallery." : ".");
  }

  // -- drawing -------------------------------------------------------------------------------

  _wireDrawing() {
    const c = this.$("canvas.try-draw");
    const dpr = window.devicePixelRatio || 1;
    c.width = SIDE * dpr;
    c.height = SIDE * dpr;
    const g = c.getContext("2d");
    g.scale(dpr, dpr);
    this.g = g;
    this._clear();
    let down = false;
    let last = null;
    const at = (e) => {
      const r = c.getBoundingClientRect();
      return [((e.clientX - r.left) * SIDE) / r.width, ((e.clientY - r.top) * SIDE) / r.height];
    };
    c.addEventListener("pointerdown", (e) => {
      down = true;
      last = at(e);
      c.setPointerCapture?.(e.pointerId);
      this.stroke(last, last);
      e.preventDefault();
    });
    c.addEventListener("pointermove", (e) => {
      if (!down) return;
      const p = at(e);
      this.stroke(last, p);
      last = p;
      e.preventDefault();
    });
    const up = () => {
      if (!down) return;
      down = false;
      this.predict();
    };
    c.addEventListener("pointerup", up);
    c.addEventListener("pointercancel", up);
    this.$(".try-clear").onclick = () => {
      this._clear();
      this.$(".try-probs").replaceChildren();
      this.$(".try-answer").textContent = this.shape ? this._prompt() : "Draw a digit in the box.";
    };
    // an image file: chosen, or dropped on the box
    this.$(".try-file").onchange = (e) => {
      const file = e.target.files?.[0];
      e.target.value = "";
      if (file) this.tryFile(file);
    };
    c.addEventListener("dragover", (e) => e.preventDefault());
    c.addEventListener("drop", (e) => {
      e.preventDefault();
      const file = e.dataTransfer?.files?.[0];
      if (file) this.tryFile(file);
    });
  }

  _clear() {
    this.g.fillStyle = this.rgb ? "#000" : "#fff";
    this.g.fillRect(0, 0, SIDE, SIDE);
  }

  /** An image file as the model's input: resized to its h x w (grey data: luminance). */
  async tryFile(file) {
    if (!this.trainer || this.kind !== "image") return;
    if (!/^image\//.test(file.type || "") && !/\.(png|jpe?g|gif|webp|bmp)$/i.test(file.name)) {
      this.$(".try-answer").textContent = `${file.name} is not an image file (PNG, JPEG, GIF, WebP or BMP).`;
      return;
    }
    let bitmap;
    try {
      bitmap = await createImageBitmap(file);
    } catch {
      this.$(".try-answer").textContent = `${file.name} could not be read as an image.`;
      return;
    }
    const cv = document.createElement("canvas");
    const k = Math.min(1, 512 / Math.max(bitmap.width, bitmap.height)); // bounded work on a big photo
    cv.width = Math.max(1, Math.round(bitmap.width * k));
    cv.height = Math.max(1, Math.round(bitmap.height * k));
    const g = cv.getContext("2d");
    g.drawImage(bitmap, 0, 0, cv.width, cv.height);
    const { input, inverted } = fromPicture(g.getImageData(0, 0, cv.width, cv.height).data, cv.width, cv.height, this.shape, this.scale);
    this._clear();
    this.g.drawImage(bitmap, 0, 0, SIDE, SIDE);
    await this.predict(input, `${file.name}${inverted ? " (light picture: turned over to the data's dark background)" : ""}`);
  }

  /** Test image `row` of the run's data (the gallery's pick) as the model's input. */
  async tryRow(row) {
    if (!this.trainer || this.kind !== "image") return;
    const ds = this.trainer.ds;
    const n = this.shape[0] * this.shape[1] * this.shape[2];
    const input = Float64Array.from(ds.x_test.data.subarray(row * n, (row + 1) * n));
    this._clear();
    drawInput(this.$("canvas.try-input"), input, this.shape, this.scale);
    this.g.imageSmoothingEnabled = false;
    this.g.drawImage(this.$("canvas.try-input"), 0, 0, SIDE, SIDE);
    this.$("#try-title")?.scrollIntoView?.({ block: "nearest" });
    await this.predict(input, `test image ${row}, a ${className(ds, ds.y_test.data[row])}`);
  }

  /** A line of ink from a to b (canvas CSS pixels). */
  stroke(a, b) {
    const g = this.g;
    g.strokeStyle = this.rgb ? this.$(".try-colour").value : "#000";
    g.lineWidth = SIDE / 9;
    g.lineCap = "round";
    g.beginPath();
    g.moveTo(a[0], a[1]);
    g.lineTo(b[0], b[1]);
    g.stroke();
  }

  /** The drawing as one row of the data: ink box, centred, averaged down to the model's h x w. */
  pixels() {
    const c = this.$("canvas.try-draw");
    const img = this.g.getImageData(0, 0, c.width, c.height);
    return fromDrawing(img.data, c.width, c.height, this.shape, this.scale, this.rgb);
  }

  /** The model's answer on `input` (default: the drawing), with every class's probability. */
  async predict(input = null, what = null) {
    if (!this.trainer || this.kind !== "image") return;
    input ??= this.pixels();
    drawInput(this.$("canvas.try-input"), input, this.shape, this.scale);
    const probs = await this.trainer.probs(input, 1);
    const ds = this.trainer.ds;
    const name = (k) => className(ds, k);
    const order = [...probs.keys()].sort((a, b) => probs[b] - probs[a]);
    this.$(".try-answer").textContent = `${what ? `${what}: ` : ""}It reads ${name(order[0])} (${(probs[order[0]] * 100).toFixed(1)}%).`;
    this.$(".try-probs").replaceChildren(...order.map((k) => {
      const li = document.createElement("li");
      li.dataset.class = String(k);
      const bar = document.createElement("meter");
      bar.min = 0;
      bar.max = 1;
      bar.value = probs[k];
      li.append(name(k), bar, `${(probs[k] * 100).toFixed(1)}%`);
      return li;
    }));
    this.lastProbs = Array.from(probs);
  }

  // -- text ----------------------------------------------------------------------------------

  _wireText() {
    this.$(".try-sample").onclick = () => this.sample();
  }

  /** A continuation of the prompt, one character at a time from the model's probabilities. */
  async sample(chars = 80, random = Math.random) {
    if (!this.trainer || this.kind !== "text" || this.busy) return null;
    this.busy = true;
    const out = this.$(".try-continuation");
    try {
      const meta = this.trainer.ds.meta;
      const vocab = [...meta.vocab];
      const index = new Map(vocab.map((ch, i) => [ch, i]));
      const prompt = this.$(".try-prompt").value;
      const unknown = [...new Set([...prompt].filter((ch) => !index.has(ch)))];
      const pad = index.has(" ") ? index.get(" ") : 0;
      const ids = [...prompt].filter((ch) => index.has(ch)).map((ch) => index.get(ch));
      const ctx = meta.context;
      let text = "";
      out.textContent = "";
      for (let k = 0; k < chars; k++) {
        const win = ids.slice(-ctx);
        while (win.length < ctx) win.unshift(pad);
        const probs = await this.trainer.probs(Int32Array.from(win), 1);
        let r = random();
        let pick = probs.length - 1;
        for (let i = 0; i < probs.length; i++) {
          r -= probs[i];
          if (r <= 0) { pick = i; break; }
        }
        ids.push(pick);
        text += vocab[pick];
        out.textContent = text;
      }
      this.$(".try-note").textContent = unknown.length
        ? `Left out of the prompt (the model never saw them): ${unknown.map((c) => JSON.stringify(c)).join(" ")}` : "";
      return text;
    } finally {
      this.busy = false;
    }
  }
}

/** [c, h, w] of a model that takes images: the image task's (any size, grey or RGB), or the
 *  square grey images of a dense task (the digits); null for other data. */
export function inputShape(spec, ds) {
  if (spec.inputKind === "image") {
    try {
      return imageShape(ds).map(Number);
    } catch {
      return null;
    }
  }
  const features = ds.x_train.shape[1];
  const side = Math.round(Math.sqrt(features));
  return spec.inputKind === "dense" && side * side === features ? [1, side, side] : null;
}

/** The largest pixel value of the data (0..16 for sklearn's digits, 255 for 8-bit images). */
function pixelScale(ds) {
  const x = ds.x_train.data;
  if (x instanceof Uint8Array) return 255;
  let max = 0;
  for (let i = 0; i < Math.min(x.length, 1 << 20); i++) if (x[i] > max) max = x[i];
  return max || 1;
}

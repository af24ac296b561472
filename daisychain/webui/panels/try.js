// "Try the model": the replica this tab holds (during or after a run) or a downloaded
// checkpoint, put to use. Digits (any dense task of square images): draw on a canvas, see the
// prediction with every class's probability. Text: type a prompt, sample a continuation from
// the character model. The forward passes run in the compute worker (worker/trainer_proxy.js
// WorkerTrainer.probs) on a copy of the parameters: the run is not touched.
//
//   const panel = new TryPanel(document.getElementById("try-panel"));
//   panel.use(trainer, "the run's model at step 120");   // a WorkerTrainer (has probs())

const SIDE = 160; // the drawing canvas, CSS pixels

export class TryPanel {
  constructor(root) {
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
    const features = ds.x_train.shape[1];
    const side = Math.round(Math.sqrt(features));
    this.kind = this.trainer.spec.inputKind === "dense" && side * side === features ? "image"
      : ds.meta && typeof ds.meta.vocab === "string" ? "text" : null;
    this.side = side;
    this.$(".try-image").hidden = this.kind !== "image";
    this.$(".try-text").hidden = this.kind !== "text";
    this.$(".try-none").hidden = this.kind !== null;
    this.$(".try-which").textContent = label;
    if (this.kind === "image") {
      // the data's pixel scale (sklearn digits: 0..16)
      let max = 0;
      for (const v of ds.x_train.data) if (v > max) max = v;
      this.scale = max || 1;
    }
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
      this.$(".try-answer").textContent = "Draw a digit in the box.";
    };
  }

  _clear() {
    this.g.fillStyle = "#fff";
    this.g.fillRect(0, 0, SIDE, SIDE);
  }

  /** A line of ink from a to b (canvas CSS pixels). */
  stroke(a, b) {
    const g = this.g;
    g.strokeStyle = "#000";
    g.lineWidth = SIDE / 9;
    g.lineCap = "round";
    g.beginPath();
    g.moveTo(a[0], a[1]);
    g.lineTo(b[0], b[1]);
    g.stroke();
  }

  /** The drawing as one row of the data: ink box, centred, averaged down to side x side. */
  pixels() {
    const c = this.$("canvas.try-draw");
    const img = this.g.getImageData(0, 0, c.width, c.height);
    const W = c.width;
    const H = c.height;
    let x0 = W;
    let y0 = H;
    let x1 = -1;
    let y1 = -1;
    for (let y = 0; y < H; y++) {
      for (let x = 0; x < W; x++) {
        if (img.data[(y * W + x) * 4] < 128) {
          if (x < x0) x0 = x;
          if (x > x1) x1 = x;
          if (y < y0) y0 = y;
          if (y > y1) y1 = y;
        }
      }
    }
    const n = this.side;
    const out = new Float64Array(n * n);
    if (x1 < 0) return out;
    // a square box around the ink, with a margin of one cell, as the digits are drawn
    const size = Math.max(x1 - x0, y1 - y0) + 1;
    const box = (size * n) / (n - 2);
    const bx = (x0 + x1) / 2 - box / 2;
    const by = (y0 + y1) / 2 - box / 2;
    const cell = box / n;
    for (let cy = 0; cy < n; cy++) {
      for (let cx = 0; cx < n; cx++) {
        let ink = 0;
        let count = 0;
        for (let y = Math.floor(by + cy * cell); y < by + (cy + 1) * cell; y++) {
          for (let x = Math.floor(bx + cx * cell); x < bx + (cx + 1) * cell; x++) {
            count++;
            if (x >= 0 && y >= 0 && x < W && y < H) ink += 1 - img.data[(y * W + x) * 4] / 255;
          }
        }
        out[cy * n + cx] = Math.round((count ? ink / count : 0) * this.scale);
      }
    }
    return out;
  }

  async predict() {
    if (!this.trainer || this.kind !== "image") return;
    const probs = await this.trainer.probs(this.pixels(), 1);
    const order = [...probs.keys()].sort((a, b) => probs[b] - probs[a]);
    this.$(".try-answer").textContent = `It reads ${order[0]} (${(probs[order[0]] * 100).toFixed(1)}%).`;
    this.$(".try-probs").replaceChildren(...order.map((k) => {
      const li = document.createElement("li");
      li.dataset.class = String(k);
      const bar = document.createElement("meter");
      bar.min = 0;
      bar.max = 1;
      bar.value = probs[k];
      li.append(`${k}`, bar, `${(probs[k] * 100).toFixed(1)}%`);
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

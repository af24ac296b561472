// A small line chart on a <canvas>: no library, nothing downloaded. It draws on the canvas it
// is given and touches no other DOM (UI code only).
//
//   const chart = new Chart(canvas, { series: [
//     { key: "loss", label: "loss", axis: "left" },
//     { key: "acc", label: "test accuracy", axis: "right", format: "percent" }], logY: false });
//   chart.add("loss", step, loss);   chart.setLog(true);   chart.clear();
//   chart.ticks()          -> {x: [...], left: [...], right: [...]}: [{value, label, px}] (CSS px)
//   chart.pixelOf(key, x, y) -> {px, py}: where a point is drawn (CSS px)
//   chart.nearest(x, y)    -> the nearest point to a canvas position: {key, label, x, y, text, px, py}
//   chart.hover(x, y)      -> the same, and the chart draws its tooltip; hover(null) clears it
//   options.onHover(point | null) is called as the pointer moves over the canvas.
//
// Axes carry numbered ticks; the left axis (loss) ranges over the data (it starts at 0 only
// when the data comes near it), or over decades on a log scale (setLog); the right axis
// (accuracy, shown once a point exists) ranges within 0..1. Sizes follow the canvas's CSS box
// and devicePixelRatio (a ResizeObserver redraws on resize). Colours come from CSS variables
// read from the canvas's computed style, so light and dark schemes apply:
//   --chart-text, --chart-grid, --chart-axis, --chart-tooltip-bg, --chart-tooltip-text,
//   --chart-series-1, --chart-series-2, ... (one per series, in order)

const DEFAULT_COLOURS = {
  text: "#555", grid: "rgba(128,128,128,0.25)", axis: "#999", tooltipBg: "rgba(30,30,30,0.92)",
  tooltipText: "#fff", series: ["#c28a00", "#2a7de1", "#2ca02c", "#d62728"],
};
const PAD = { l: 52, r: 14, t: 12, b: 30 };
const RIGHT_PAD = 48;

/** A "nice" step (1, 2 or 5 times a power of ten) near `raw`. */
function niceStep(raw) {
  const p = 10 ** Math.floor(Math.log10(raw));
  const f = raw / p;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
}

/** Linear ticks across [lo, hi] (about `n`), and the range widened to whole steps. */
export function linearTicks(lo, hi, n = 5) {
  if (!(hi > lo)) {
    const d = Math.abs(lo) * 0.1 || 1;
    lo -= d;
    hi += d;
  }
  const step = niceStep((hi - lo) / Math.max(1, n - 1));
  const a = Math.floor(lo / step + 1e-9) * step;
  const b = Math.ceil(hi / step - 1e-9) * step;
  const out = [];
  for (let v = a, i = 0; v <= b + step * 1e-9 && i < 100; v = a + ++i * step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  return { lo: a, hi: b, ticks: out, decimals };
}

/** Log ticks across [lo, hi] (both > 0): powers of ten, with 2 and 5 between when few. */
export function logTicks(lo, hi) {
  let e0 = Math.floor(Math.log10(lo) + 1e-9);
  let e1 = Math.ceil(Math.log10(hi) - 1e-9);
  if (e1 <= e0) e1 = e0 + 1;
  const out = [];
  const few = e1 - e0 <= 2;
  for (let e = e0; e <= e1; e++) {
    for (const m of few ? [1, 2, 5] : [1]) {
      const v = m * 10 ** e;
      if (v >= 10 ** e0 * (1 - 1e-9) && v <= 10 ** e1 * (1 + 1e-9)) out.push(Number(v.toPrecision(12)));
    }
  }
  // a range within one decade reads better trimmed to the ticks around the data
  let a = 0;
  let b = out.length - 1;
  while (a + 1 < out.length && out[a + 1] <= lo) a++;
  while (b - 1 > a && out[b - 1] >= hi) b--;
  const ticks = out.slice(a, b + 1);
  e0 = Math.log10(ticks[0]);
  e1 = Math.log10(ticks[ticks.length - 1]);
  return { lo: ticks[0], hi: ticks[ticks.length - 1], ticks, logLo: e0, logHi: e1 };
}

function fmt(v, decimals) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e6 || a < 1e-4) return v.toExponential(1).replace("e+", "e");
  return v.toFixed(Math.min(decimals, 6));
}

function fmtLog(v) {
  const a = Math.abs(v);
  if (a >= 1e5 || a < 1e-3) return v.toExponential(0).replace("e+", "e");
  return String(Number(v.toPrecision(3)));
}

function fmtPoint(v, format) {
  if (format === "percent") return `${(v * 100).toFixed(2)}%`;
  const a = Math.abs(v);
  return a !== 0 && (a >= 1e6 || a < 1e-4) ? v.toExponential(3) : String(Number(v.toPrecision(5)));
}

export class Chart {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {{series?: {key: string, label: string, axis?: "left"|"right", format?: string}[],
   *          logY?: boolean, maxPoints?: number, xLabel?: string, empty?: string,
   *          onHover?: (p: object|null) => void, minDrawMs?: number}} o  minDrawMs: new points
   *          are drawn at most this often (a run's steps can come 15 times a second, and each
   *          draw costs the page's thread its style, layout and paint)
   */
  constructor(canvas, { series = [{ key: "loss", label: "loss", axis: "left" }], logY = false, maxPoints = 5000,
    xLabel = "step", empty = "the loss appears here once training starts", onHover = null, minDrawMs = 0 } = {}) {
    this.canvas = canvas;
    this.series = series.map((s, i) => ({ axis: "left", format: null, ...s, index: i, points: [] }));
    this.byKey = new Map(this.series.map((s) => [s.key, s]));
    this.logY = !!logY;
    this.maxPoints = maxPoints;
    this.xLabel = xLabel;
    this.empty = empty;
    this.onHover = onHover;
    this.minDrawMs = minDrawMs;
    this.hovered = null; // the point under the pointer, or null
    this._queued = false;
    this._drawnAt = -Infinity; // when a scheduled draw last ran
    this._layout = null;
    this._onMove = (e) => {
      const r = canvas.getBoundingClientRect();
      const p = this.hover(e.clientX - r.left, e.clientY - r.top);
      if (this.onHover) this.onHover(p);
    };
    this._onLeave = () => {
      this.hover(null);
      if (this.onHover) this.onHover(null);
    };
    canvas.addEventListener("pointermove", this._onMove);
    canvas.addEventListener("pointerleave", this._onLeave);
    if (typeof ResizeObserver !== "undefined") {
      this._resize = new ResizeObserver(() => this._schedule());
      this._resize.observe(canvas);
    }
    this._scheme = typeof matchMedia === "function" ? matchMedia("(prefers-color-scheme: dark)") : null;
    this._onScheme = () => this._schedule();
    this._scheme?.addEventListener?.("change", this._onScheme);
    this.draw();
  }

  /** Stop listening (pointer, resize, colour scheme). */
  destroy() {
    this.canvas.removeEventListener("pointermove", this._onMove);
    this.canvas.removeEventListener("pointerleave", this._onLeave);
    this._resize?.disconnect();
    this._scheme?.removeEventListener?.("change", this._onScheme);
  }

  clear() {
    for (const s of this.series) s.points = [];
    this.hovered = null;
    this.draw();
  }

  /** Add the point (x, y) to series `key`; non-finite values are ignored. */
  add(key, x, y) {
    const s = this.byKey.get(key);
    if (!s) throw new Error(`chart: no series ${key}`);
    if (!Number.isFinite(x) || !Number.isFinite(y)) return;
    s.points.push([x, y]);
    if (s.points.length > this.maxPoints) { // keep every other point: the shape stays
      s.points = s.points.filter((_, i) => i % 2 === 0 || i === s.points.length - 1);
    }
    this._schedule();
  }

  setLog(on) {
    this.logY = !!on;
    this.draw();
  }

  _schedule() {
    if (this._queued) return;
    this._queued = true;
    const go = () => { this._queued = false; this._drawnAt = performance.now(); this.draw(); };
    const frame = () => (typeof requestAnimationFrame === "function" ? requestAnimationFrame(go) : setTimeout(go, 16));
    const wait = this._drawnAt + this.minDrawMs - performance.now();
    if (wait > 0) setTimeout(frame, wait); else frame();
  }

  _colours() {
    const cs = getComputedStyle(this.canvas);
    const v = (name, dflt) => cs.getPropertyValue(name).trim() || dflt;
    return {
      text: v("--chart-text", DEFAULT_COLOURS.text), grid: v("--chart-grid", DEFAULT_COLOURS.grid),
      axis: v("--chart-axis", DEFAULT_COLOURS.axis), tooltipBg: v("--chart-tooltip-bg", DEFAULT_COLOURS.tooltipBg),
      tooltipText: v("--chart-tooltip-text", DEFAULT_COLOURS.tooltipText),
      series: this.series.map((s, i) => v(`--chart-series-${i + 1}`, DEFAULT_COLOURS.series[i % DEFAULT_COLOURS.series.length])),
    };
  }

  /** Scales and ticks for the current data and size (CSS pixels). */
  _computeLayout(w, h) {
    const xs = [];
    for (const s of this.series) for (const p of s.points) xs.push(p[0]);
    if (!xs.length) return null;
    const hasRight = this.series.some((s) => s.axis === "right" && s.points.length);
    const pad = { ...PAD, r: hasRight ? RIGHT_PAD : PAD.r };
    const plotW = Math.max(10, w - pad.l - pad.r);
    const plotH = Math.max(10, h - pad.t - pad.b);
    let x0 = Math.min(...xs);
    let x1 = Math.max(...xs);
    const xt = linearTicks(x0, x1 > x0 ? x1 : x0 + 1, Math.max(2, Math.floor(plotW / 80)));
    x0 = xt.lo;
    x1 = xt.hi;
    const X = (x) => pad.l + ((x - x0) / (x1 - x0)) * plotW;
    const axes = {};
    for (const side of ["left", "right"]) {
      const ys = [];
      for (const s of this.series) if (s.axis === side) for (const p of s.points) if (!(this.logY && side === "left" && p[1] <= 0)) ys.push(p[1]);
      if (!ys.length) continue;
      let lo = Math.min(...ys);
      let hi = Math.max(...ys);
      const n = Math.max(2, Math.floor(plotH / 40));
      if (side === "left" && this.logY) {
        const t = logTicks(lo, hi);
        const Y = (y) => pad.t + plotH - ((Math.log10(y) - t.logLo) / (t.logHi - t.logLo)) * plotH;
        axes[side] = { Y, ticks: t.ticks.map((v) => ({ value: v, label: fmtLog(v), px: Y(v) })), log: true };
        continue;
      }
      if (side === "right") { // accuracy: within 0..1
        lo = Math.max(0, lo - 0.02);
        hi = Math.min(1, hi + 0.02);
      } else if (lo >= 0 && lo <= 0.2 * hi) {
        lo = 0; // the data comes near 0: show 0
      } else {
        const d = (hi - lo) * 0.05 || Math.abs(hi) * 0.05 || 1;
        lo -= d;
        hi += d;
      }
      const t = linearTicks(lo, hi, n);
      const Y = (y) => pad.t + plotH - ((y - t.lo) / (t.hi - t.lo)) * plotH;
      const pct = this.series.some((s) => s.axis === side && s.format === "percent");
      const step = t.ticks.length > 1 ? t.ticks[1] - t.ticks[0] : 1;
      const pd = Math.max(0, -Math.floor(Math.log10(step * 100) + 1e-9));
      axes[side] = { Y, ticks: t.ticks.map((v) => ({ value: v, label: pct ? `${(v * 100).toFixed(pd)}%` : fmt(v, t.decimals), px: Y(v) })), log: false };
    }
    const xTicks = xt.ticks.map((v) => ({ value: v, label: fmt(v, xt.decimals), px: X(v) }));
    return { w, h, pad, plotW, plotH, X, axes, xTicks };
  }

  /** The axes' ticks as drawn: {x, left, right} of [{value, label, px}] (CSS pixels). */
  ticks() {
    const L = this._layout || this._computeLayout(this._cssSize()[0], this._cssSize()[1]);
    if (!L) return { x: [], left: [], right: [] };
    return { x: L.xTicks, left: L.axes.left?.ticks || [], right: L.axes.right?.ticks || [] };
  }

  _cssSize() {
    const c = this.canvas;
    return [c.clientWidth || 480, c.clientHeight || 200];
  }

  /** Where the point (x, y) of series `key` is drawn, in canvas CSS pixels: {px, py}, or null. */
  pixelOf(key, x, y) {
    const L = this._layout;
    const ax = L?.axes[this.byKey.get(key)?.axis];
    if (!ax || (ax.log && y <= 0)) return null;
    return { px: L.X(x), py: ax.Y(y) };
  }

  /** The nearest point to (px, py) in canvas CSS pixels, by distance on the screen; or null. */
  nearest(px, py) {
    const L = this._layout;
    if (!L || px === null || px === undefined) return null;
    let best = null;
    let bestD = Infinity;
    for (const s of this.series) {
      const ax = L.axes[s.axis];
      if (!ax) continue;
      for (const [x, y] of s.points) {
        if (ax.log && y <= 0) continue;
        const sx = L.X(x);
        const sy = ax.Y(y);
        // x counts more than y: the pointer picks a step first, then the nearer series
        const d = (sx - px) ** 2 + 0.25 * (sy - py) ** 2;
        if (d < bestD) {
          bestD = d;
          best = { key: s.key, label: s.label, x, y, text: `${this.xLabel} ${x}: ${s.label} ${fmtPoint(y, s.format)}`, px: sx, py: sy };
        }
      }
    }
    return best;
  }

  /** Show the tooltip of the point nearest (px, py) (null: none); returns that point. */
  hover(px, py) {
    this.hovered = px === null || px === undefined ? null : this.nearest(px, py);
    this.draw();
    return this.hovered;
  }

  draw() {
    const c = this.canvas;
    const dpr = (typeof window !== "undefined" && window.devicePixelRatio) || 1;
    const [w, h] = this._cssSize();
    const bw = Math.round(w * dpr);
    const bh = Math.round(h * dpr);
    if (c.width !== bw || c.height !== bh) {
      c.width = bw;
      c.height = bh;
    }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const col = this._colours();
    g.font = "11px system-ui, sans-serif";
    const L = this._layout = this._computeLayout(w, h);
    if (!L) {
      g.fillStyle = col.text;
      g.textAlign = "center";
      g.textBaseline = "middle";
      g.fillText(this.empty, w / 2, h / 2);
      return;
    }
    const { pad, plotW, plotH } = L;
    // grid and ticks
    g.lineWidth = 1;
    g.strokeStyle = col.grid;
    g.fillStyle = col.text;
    g.textBaseline = "middle";
    g.textAlign = "right";
    const left = L.axes.left || L.axes.right;
    for (const t of left.ticks) {
      g.beginPath();
      g.moveTo(pad.l, Math.round(t.px) + 0.5);
      g.lineTo(pad.l + plotW, Math.round(t.px) + 0.5);
      g.stroke();
      g.fillText(t.label, pad.l - 6, t.px);
    }
    if (L.axes.left && L.axes.right) {
      g.textAlign = "left";
      for (const t of L.axes.right.ticks) g.fillText(t.label, pad.l + plotW + 6, t.px);
    }
    g.textAlign = "center";
    g.textBaseline = "top";
    for (const t of L.xTicks) {
      g.beginPath();
      g.moveTo(Math.round(t.px) + 0.5, pad.t);
      g.lineTo(Math.round(t.px) + 0.5, pad.t + plotH);
      g.stroke();
      g.fillText(t.label, t.px, pad.t + plotH + 5);
    }
    g.strokeStyle = col.axis;
    g.strokeRect(pad.l + 0.5, pad.t + 0.5, plotW, plotH);
    g.textAlign = "right";
    g.fillText(this.xLabel, pad.l + plotW, h - 11);
    // the series
    g.save();
    g.beginPath();
    g.rect(pad.l, pad.t, plotW, plotH);
    g.clip();
    for (const s of this.series) {
      const ax = L.axes[s.axis];
      if (!ax || !s.points.length) continue;
      g.strokeStyle = col.series[s.index];
      g.fillStyle = col.series[s.index];
      g.lineWidth = 1.5;
      g.beginPath();
      let started = false;
      for (const [x, y] of s.points) {
        if (ax.log && y <= 0) continue;
        const sx = L.X(x);
        const sy = ax.Y(y);
        if (started) g.lineTo(sx, sy); else g.moveTo(sx, sy);
        started = true;
      }
      g.stroke();
      if (s.points.length < 40) for (const [x, y] of s.points) {
        if (ax.log && y <= 0) continue;
        g.beginPath();
        g.arc(L.X(x), ax.Y(y), 2.5, 0, 2 * Math.PI);
        g.fill();
      }
    }
    g.restore();
    // legend
    g.textAlign = "left";
    g.textBaseline = "top";
    let lx = pad.l + 8;
    for (const s of this.series) {
      if (!s.points.length) continue;
      g.fillStyle = col.series[s.index];
      g.fillRect(lx, pad.t + 7, 10, 3);
      g.fillStyle = col.text;
      g.fillText(s.label + (s.axis === "left" && this.logY ? " (log)" : ""), lx + 14, pad.t + 3);
      lx += 24 + g.measureText(s.label).width + (this.logY ? 30 : 0);
    }
    // tooltip
    const p = this.hovered;
    if (p) {
      g.fillStyle = col.series[this.byKey.get(p.key).index];
      g.beginPath();
      g.arc(p.px, p.py, 4, 0, 2 * Math.PI);
      g.fill();
      const tw = g.measureText(p.text).width + 12;
      const tx = Math.min(Math.max(pad.l, p.px + 8), w - tw - 2);
      const ty = Math.max(2, p.py - 26);
      g.fillStyle = col.tooltipBg;
      g.fillRect(tx, ty, tw, 18);
      g.fillStyle = col.tooltipText;
      g.textBaseline = "middle";
      g.fillText(p.text, tx + 6, ty + 9);
    }
  }
}

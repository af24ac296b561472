// A small live loss plot on a <canvas>: no libraries, nothing downloaded. UI code only.
//
//   const plot = new LossPlot(canvas);
//   plot.push(step, loss);  plot.clear();

export class LossPlot {
  constructor(canvas, { maxPoints = 5000 } = {}) {
    this.canvas = canvas;
    this.points = [];
    this.maxPoints = maxPoints;
    this._queued = false;
    this.draw();
  }

  clear() {
    this.points = [];
    this.draw();
  }

  push(step, loss) {
    if (!Number.isFinite(loss)) return;
    this.points.push([step, loss]);
    if (this.points.length > this.maxPoints) { // keep every other point: the shape stays
      this.points = this.points.filter((_, i) => i % 2 === 0);
    }
    if (!this._queued) {
      this._queued = true;
      requestAnimationFrame(() => { this._queued = false; this.draw(); });
    }
  }

  draw() {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth || 480;
    const h = c.clientHeight || 180;
    if (c.width !== Math.round(w * dpr)) { c.width = Math.round(w * dpr); c.height = Math.round(h * dpr); }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const pad = { l: 44, r: 10, t: 10, b: 22 };
    g.strokeStyle = "#ccc";
    g.strokeRect(pad.l, pad.t, w - pad.l - pad.r, h - pad.t - pad.b);
    g.fillStyle = "#666";
    g.font = "11px system-ui, sans-serif";
    if (!this.points.length) {
      g.fillText("loss appears here once training starts", pad.l + 8, h / 2);
      return;
    }
    const xs = this.points.map((p) => p[0]);
    const ys = this.points.map((p) => p[1]);
    const x0 = Math.min(...xs);
    const x1 = Math.max(x0 + 1, ...xs);
    const y0 = Math.min(0, ...ys);
    const y1 = Math.max(y0 + 1e-9, ...ys);
    const X = (x) => pad.l + ((x - x0) / (x1 - x0)) * (w - pad.l - pad.r);
    const Y = (y) => h - pad.b - ((y - y0) / (y1 - y0)) * (h - pad.t - pad.b);
    g.fillText(y1.toFixed(3), 2, pad.t + 9);
    g.fillText(y0.toFixed(3), 2, h - pad.b);
    g.fillText(`step ${x0}`, pad.l, h - 6);
    const right = `step ${x1}`;
    g.fillText(right, w - pad.r - g.measureText(right).width, h - 6);
    g.strokeStyle = "#c28a00";
    g.lineWidth = 1.5;
    g.beginPath();
    this.points.forEach(([x, y], i) => (i ? g.lineTo(X(x), Y(y)) : g.moveTo(X(x), Y(y))));
    g.stroke();
  }
}

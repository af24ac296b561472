// The chart of the Training card, behind the API of chart.js (`new Chart(canvas, {series,
// logY})`, `add(key, x, y)`, `setLog(bool)`): app.js imports Chart from here, so that moving
// to chart.js is one import line. Until then this adapts plot.js: the loss series only, its
// log scale drawn as log10(loss). UI code only.

import { LossPlot } from "./plot.js";

export class Chart {
  constructor(canvas, { series = [], logY = false } = {}) {
    this.series = series;
    this.logY = logY;
    this.points = [];
    this.plot = new LossPlot(canvas);
  }

  add(key, x, y) {
    if (key !== "loss" || !Number.isFinite(y)) return;
    this.points.push([x, y]);
    this._push(x, y);
  }

  clear() {
    this.points = [];
    this.plot.clear();
  }

  setLog(on) {
    this.logY = !!on;
    this.plot.clear();
    for (const [x, y] of this.points) this._push(x, y);
  }

  _push(x, y) {
    if (this.logY) {
      if (y > 0) this.plot.push(x, Math.log10(y));
    } else this.plot.push(x, y);
  }
}

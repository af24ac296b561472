// The loss and test-accuracy chart of the run (chart.js draws it).
// A panel of the page: it subscribes to what it shows, owns its part of the DOM and reads the
// store (store.js); its points are kept in state.chart.

import { Chart } from "../chart.js";
import { $, ctx, dispatch } from "./store.js";

/** New points are drawn at most this often: a one-core tab's steps came ~15 a second, and
 *  drawing at each one took its page's thread ~20 ms of style, layout and paint a step. */
const DRAW_EVERY_MS = 250;

export class ChartPanel {
  constructor(bus) {
    this.chart = new Chart($("loss-plot"), {
      series: [{ key: "loss", label: "loss", axis: "left" }, { key: "accuracy", label: "test accuracy", axis: "right" }],
      logY: $("log-scale").checked,
      minDrawMs: DRAW_EVERY_MS,
    });
    ctx.chart = this.chart;
    bus.on("page:new-run", () => this.chart.clear());
    bus.on("run:step", (s) => {
      this.add("loss", s.step, s.loss);
      if (Number.isFinite(s.accuracy)) this.add("accuracy", s.step, s.accuracy);
    });
    bus.on("run:done", (s) => { if (Number.isFinite(s.accuracy)) this.add("accuracy", s.step, s.accuracy); });
    bus.on("page:accuracy", ({ step, value }) => this.add("accuracy", step, value));
    $("log-scale").onchange = (e) => this.chart.setLog(e.target.checked);
  }

  add(key, x, y) {
    if (!Number.isFinite(y)) return;
    dispatch("chart:point", { key, x, y });
    this.chart.add(key, x, y);
  }
}

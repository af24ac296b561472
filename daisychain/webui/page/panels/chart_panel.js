// The loss and test-accuracy chart of the run (chart.js draws it).
// A panel of the page (app.js wires the bus to them): it owns its part of the DOM and reads
// the one store (store.js state).

import { Chart } from "../chart.js";
import { $, ctx, state } from "./store.js";

// -- the run -----------------------------------------------------------------------------------


export function newChart() {
  state.chart = { loss: [], accuracy: [] };
  if (ctx.chart && typeof ctx.chart.clear === "function") {
    ctx.chart.clear();
    return;
  }
  ctx.chart = new Chart($("loss-plot"), {
    series: [{ key: "loss", label: "loss", axis: "left" }, { key: "accuracy", label: "test accuracy", axis: "right" }],
    logY: $("log-scale").checked,
  });
}

export function chartAdd(key, x, y) {
  if (!Number.isFinite(y)) return;
  state.chart[key].push([x, y]);
  ctx.chart.add(key, x, y);
}

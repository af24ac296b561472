// The loss plot of the page: a thin wrapper over chart.js (kept so that callers of LossPlot
// keep working; new code uses Chart directly). UI code only.
//
//   const plot = new LossPlot(canvas);
//   plot.push(step, loss);  plot.clear();  plot.chart.setLog(true);

import { Chart } from "./chart.js";

export class LossPlot {
  constructor(canvas, { maxPoints = 5000 } = {}) {
    this.chart = new Chart(canvas, { series: [{ key: "loss", label: "loss", axis: "left" }], maxPoints });
  }

  clear() { this.chart.clear(); }

  push(step, loss) { this.chart.add("loss", step, loss); }
}

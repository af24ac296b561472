// Deterministic Adam over the flat float64 parameter vector, line for line
// daisychain/engine/adam.py: per element, one IEEE float64 op at a time, in this order,
// bias corrections as running products (no pow):
//   b1t = b1t * beta1; b2t = b2t * beta2
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * (g * g)
//   mhat = m / (1 - b1t); vhat = v / (1 - b2t)
//   u = mhat / (sqrt(vhat) + eps)
//   p = p - lr * u                                (weight_decay == 0)
//   p = p - (lr * u + (lr * weight_decay) * p)    (weight_decay > 0)
// lr is the schedule's rate of this update: augment.js lrAt(hp, t), t = the updates before it.

import { lrAt } from "./augment.js";

export class AdamState {
  constructor(size) {
    this.m = new Float64Array(size);
    this.v = new Float64Array(size);
    this.step = 0;
    this.b1t = 1.0;
    this.b2t = 1.0;
  }
}

/** Update theta (Float64Array) and state in place with the averaged gradient g. */
export function adamStep(theta, state, g, hp) {
  const b1 = hp.beta1;
  const b2 = hp.beta2;
  const lr = lrAt(hp, state.step);
  state.step += 1;
  state.b1t = state.b1t * b1;
  state.b2t = state.b2t * b2;
  const c1 = 1.0 - b1;
  const c2 = 1.0 - b2;
  const d1 = 1.0 - state.b1t;
  const d2 = 1.0 - state.b2t;
  const { m, v } = state;
  const eps = hp.eps;
  const wd = hp.weight_decay;
  const lrwd = lr * wd;
  for (let i = 0; i < theta.length; i++) {
    const gi = g[i];
    m[i] = b1 * m[i] + c1 * gi;
    v[i] = b2 * v[i] + c2 * (gi * gi);
    const mhat = m[i] / d1;
    const vhat = v[i] / d2;
    const u = mhat / (Math.sqrt(vhat) + eps);
    theta[i] = wd ? theta[i] - (lr * u + lrwd * theta[i]) : theta[i] - lr * u;
  }
}

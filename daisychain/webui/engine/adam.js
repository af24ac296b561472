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

/** A step's scalars, in adamStep's order (the learning rate at the state's step, the
 *  running products advanced: state.step += 1); wasm/wasm_adam.js takes the same. */
export function adamScalars(state, hp) {
  const b1 = hp.beta1;
  const b2 = hp.beta2;
  const lr = lrAt(hp, state.step);
  state.step += 1;
  state.b1t = state.b1t * b1;
  state.b2t = state.b2t * b2;
  const wd = hp.weight_decay;
  return { b1, b2, lr, c1: 1.0 - b1, c2: 1.0 - b2, d1: 1.0 - state.b1t, d2: 1.0 - state.b2t, eps: hp.eps,
    wd, lrwd: lr * wd };
}

/** Update theta (Float64Array) and state in place with the gradient g, or with an integer
 *  total and gscale (a power of two) and gdiv to make it element by element:
 *  g = (total * gscale) / gdiv, the trainer's meanGrad (adam.py adam_step's gscale, gdiv). */
export function adamStep(theta, state, g, hp, gscale = 1.0, gdiv = 1) {
  const { b1, b2, lr, c1, c2, d1, d2, eps, wd, lrwd } = adamScalars(state, hp);
  const { m, v } = state;
  const size = theta.length;
  const mean = !(gscale === 1.0 && gdiv === 1);
  if (m.length !== size || v.length !== size || g.length < size) throw new RangeError("adam: sizes differ");
  for (let i = 0; i < size; i++) {
    const gi = mean ? (g[i] * gscale) / gdiv : g[i];
    const mi = b1 * m[i] + c1 * gi;
    const vi = b2 * v[i] + c2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const u = (mi / d1) / (Math.sqrt(vi / d2) + eps);
    const ti = theta[i];
    theta[i] = wd ? ti - (lr * u + lrwd * ti) : ti - lr * u;
  }
}

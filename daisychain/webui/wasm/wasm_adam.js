// Adam in the WebAssembly module (units.adam.wat `adam`): engine/adam.js adamStep with the
// same arguments and the same bits. adamStep stays the reference and the fallback; the
// trainer (engine/trainer.js) takes this kernel where its units are the checked module's
// (wasm_units.js WasmUnits.adamKernel), which checks it on its first, cold calls
// (adamSelfCheck, at openWasmUnits) against adamStep.
//
// Each kernel has its own instance of the module, its memory laid out once for `size`
// parameters: theta, m, v and the gradient, float64 each. A caller whose arrays are this
// memory's views (`theta`, `state()`: the trainer's own parameters and moments) is stepped in
// place; any other arrays are copied in and out around the call (same bits either way).
// The scalar part of the step (the learning rate, the running products, 1 - beta, 1 - b1t)
// is adamStep's JS, once per step.

import { AdamState, adamScalars, adamStep } from "../engine/adam.js";

const up = (x, m) => Math.ceil(x / m) * m;

export class WasmAdam {
  /** A kernel for `size` parameters on an instance of `module`; throws a RangeError where
   *  the browser will not give it the memory. */
  constructor(module, size) {
    const instance = new WebAssembly.Instance(module, {});
    this.k = instance.exports;
    this.mem = instance.exports.memory;
    this.size = size;
    const bytes = up(8 * size, 16);
    const need = 4 * bytes - this.mem.buffer.byteLength;
    if (need > 0) this.mem.grow(Math.ceil(need / 65536)); // once: the views below stay attached
    [this.pt, this.pm, this.pv, this.pg] = [0, bytes, 2 * bytes, 3 * bytes];
    const view = (p) => new Float64Array(this.mem.buffer, p, size);
    this.theta = view(this.pt);
    this.m = view(this.pm);
    this.v = view(this.pv);
    this.g = view(this.pg);
  }

  /** A fresh AdamState (zero moments) whose m and v are this memory: stepped in place. */
  state() {
    const st = new AdamState(0);
    st.m = this.m.fill(0);
    st.v = this.v.fill(0);
    return st;
  }

  /** adamStep(theta, state, g, hp, gscale, gdiv) in the module: the same updates of theta
   *  and state, the same bits. */
  step(theta, state, g, hp, gscale = 1.0, gdiv = 1) {
    const size = theta.length;
    const { m, v } = state;
    if (size !== this.size) return adamStep(theta, state, g, hp, gscale, gdiv); // not laid out for it
    if (m.length !== size || v.length !== size || g.length < size) throw new RangeError("adam: sizes differ");
    const { b1, b2, lr, c1, c2, d1, d2, eps, wd, lrwd } = adamScalars(state, hp); // adamStep's, in its order
    const mean = !(gscale === 1.0 && gdiv === 1);
    // g * 1.0 and g / 1 are g itself: those operations are left out (adam.py does the same)
    const flags = (mean && gscale !== 1.0 ? 1 : 0) | (mean && gdiv !== 1 ? 2 : 0) | (wd ? 4 : 0);
    const copy = (a, view) => { if (a !== view) view.set(a.length === size ? a : a.subarray(0, size)); };
    copy(theta, this.theta);
    copy(m, this.m);
    copy(v, this.v);
    copy(g, this.g);
    this.k.adam(this.pt, this.pm, this.pv, this.pg, size, flags, b1, b2, c1, c2, d1, d2, eps, lr, lrwd, gscale, gdiv);
    if (theta !== this.theta) theta.set(this.theta);
    if (m !== this.m) m.set(this.m);
    if (v !== this.v) v.set(this.v);
  }
}

/** null when the kernel's first, cold calls give adamStep's bits (theta, m, v, the running
 *  products) on odd and even sizes, with and without the mean gradient's scale and divisor
 *  and weight decay, subnormal and signed-zero values among them; else the first difference. */
export function adamSelfCheck(module) {
  let seed = 0x6d2b79f5;
  const rnd = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return (seed >>> 8) / 16777216; };
  const vec = (n, f) => Float64Array.from({ length: n }, (_, i) => f(i));
  const special = [0, -0, 5e-324, -5e-324, 2.2250738585072014e-308, 1e-300, 1, -1, 3e5, -7.5];
  const bits = (a) => Array.from(new BigUint64Array(Float64Array.from(a).buffer));
  let c = 0;
  for (const n of [1, 2, 3, 10, 37]) {
    for (const [gscale, gdiv] of [[1.0, 1], [2 ** -40, 1], [2 ** -38, 3], [1.0, 5]]) {
      for (const weight_decay of [0, 0.01]) {
        c += 1;
        const hp = { beta1: 0.9, beta2: 0.999, eps: 1e-8, lr: 0.003 * (1 + (c % 3)), weight_decay,
          lr_warmup: c % 4 === 1 ? 5 : 0, lr_decay_steps: c % 4 === 2 ? 40 : 0 };
        const theta = vec(n, (i) => (i < special.length && c % 2 ? special[i] : rnd() - 0.5));
        const g = vec(n, (i) => (gscale === 1.0 && gdiv === 1 ? (rnd() - 0.5) * 2 ** -(i % 30)
          : Math.floor((rnd() - 0.5) * 2 ** 40)));
        const m = vec(n, (i) => (i % 3 ? (rnd() - 0.5) * 1e-3 : 0));
        const v = vec(n, (i) => (i % 3 ? rnd() * 1e-6 : i % 2 ? 5e-324 : 0));
        const mk = (st = new AdamState(n)) => {
          st.m.set(m);
          st.v.set(v);
          return Object.assign(st, { step: c % 7, b1t: 0.9 ** (c % 7), b2t: 0.999 ** (c % 7) });
        };
        const ref = [theta.slice(), mk()];
        let inPlace;
        let copied;
        try {
          const k = new WasmAdam(module, n); // the trainer's way: its views, stepped in place
          k.theta.set(theta);
          inPlace = [k.theta, mk(k.state())];
          copied = [theta.slice(), mk()]; // any other arrays: copied in and out
          const k2 = new WasmAdam(module, n);
          for (let r = 0; r < 2; r++) {
            k.step(inPlace[0], inPlace[1], g, hp, gscale, gdiv);
            k2.step(copied[0], copied[1], g, hp, gscale, gdiv);
            adamStep(ref[0], ref[1], g, hp, gscale, gdiv);
          }
        } catch (err) {
          return `Adam (${n} values): ${err.message}`;
        }
        for (const [how, [t2, s2]] of [["in place", inPlace], ["copied", copied]]) {
          const [t1, s1] = ref;
          for (const [name, a, b] of [["theta", t1, t2], ["m", s1.m, s2.m], ["v", s1.v, s2.v],
            ["the running products", [s1.b1t, s1.b2t, s1.step], [s2.b1t, s2.b2t, s2.step]]]) {
            const [x, y] = [bits(a), bits(b)];
            const i = x.findIndex((w, j) => w !== y[j]);
            if (i >= 0) return `Adam (${n} values ${how}, gscale ${gscale}, gdiv ${gdiv}, weight decay ${weight_decay}): ${name}[${i}] is ${b[i]} in the module, adamStep gives ${a[i]}`;
          }
        }
      }
    }
  }
  return null;
}

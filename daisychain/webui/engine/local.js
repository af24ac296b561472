// Exact local steps (DiLoCo), line for line daisychain/engine/local.py: R replicas each take
// H inner Adam steps from the global parameters theta_g, then one outer Nesterov step on
// their averaged parameter deltas, summed as fixed-point integers. A run step is a round and
// the tasks of a step are the replicas; contribute / apply / snapshot / load are the
// Trainer's seam.
//
// Round n, replica j, inner step h trains on the synchronous schedule's step (n*H + h)*R + j
// with the replica's own moments; then, per element:
//   delta = theta_g - theta_j;  q = clamp(floor(delta * 2^D + 0.5), -L, L)   (L = floor(2^51 / R))
// A task's contribution: [q (P) | per replica k: m lo, m hi, v lo, v hi (P each: the unsigned
// 32-bit halves of the float64 bits; zero but for the replicas the task computed)].
// apply(total), per element, in this order (one IEEE float64 op each):
//   d = Q * 2^-(D + log2 R)  (R a power of two)  or  d = (Q * 2^-D) / R
//   buf = mu * buf + d;  theta_g = theta_g - lr_o * (d + mu * buf)

import { adamStep, AdamState } from "./adam.js";
import { pow2 } from "./detmath.js";
import { isLocal, nMicro } from "./spec.js";
import { paramsSha256, Trainer } from "./trainer.js";

export const DELTA_FRAC_BITS = 32;
const TWO32 = 4294967296;

/** L = floor(2^51 / R). */
export const deltaLimit = (replicas) => Math.floor(2251799813685248 / replicas);

const scratch = new DataView(new ArrayBuffer(8));

/** Write m and v of one replica as [m lo, m hi, v lo, v hi] into out at `at`. */
export function packMoments(m, v, out, at) {
  const p = m.length;
  [m, v].forEach((a, k) => {
    for (let i = 0; i < p; i++) {
      scratch.setFloat64(0, a[i], true);
      out[at + 2 * k * p + i] = scratch.getUint32(0, true);
      out[at + (2 * k + 1) * p + i] = scratch.getUint32(4, true);
    }
  });
}

/** The inverse of packMoments; RangeError when a half is not an unsigned 32-bit integer or a
 *  moment is not finite (or a second moment negative). */
export function unpackMoments(total, at, p) {
  const m = new Float64Array(p);
  const v = new Float64Array(p);
  [m, v].forEach((a, k) => {
    for (let i = 0; i < p; i++) {
      const lo = total[at + 2 * k * p + i];
      const hi = total[at + (2 * k + 1) * p + i];
      if (!(Number.isInteger(lo) && Number.isInteger(hi) && lo >= 0 && hi >= 0 && lo < TWO32 && hi < TWO32)) {
        throw new RangeError("the total's moment block is not unsigned 32-bit halves");
      }
      scratch.setUint32(0, lo, true);
      scratch.setUint32(4, hi, true);
      a[i] = scratch.getFloat64(0, true);
      if (!Number.isFinite(a[i]) || (k === 1 && a[i] < 0)) throw new RangeError("the total's moments are not finite");
    }
  });
  return { m, v };
}

export class LocalTrainer {
  static async create(o) {
    return new LocalTrainer(o);
  }

  constructor(o) {
    this.base = new Trainer(o);
    const b = this.base;
    this.spec = b.spec;
    this.hp = b.hp;
    this.ds = b.ds;
    this.luts = b.luts;
    this.engine = b.engine;
    this.layout = b.layout;
    this.schedule = b.schedule;
    this.replicas = this.hp.replicas;
    this.syncEvery = this.hp.sync_every;
    const p = this.layout.size;
    this.nTasks = this.replicas; // tasks of a step (a round): one per replica
    this._totalSize = p * (1 + 4 * this.replicas);
    this.limit = deltaLimit(this.replicas);
    this.theta = b.theta; // theta_g
    this.outer = new Float64Array(p);
    this.m = Array.from({ length: this.replicas }, () => new Float64Array(p));
    this.v = Array.from({ length: this.replicas }, () => new Float64Array(p));
    this.step = 0; // rounds done
    this.inner = 0; // inner Adam steps each replica took
    this.b1t = 1.0;
    this.b2t = 1.0;
  }

  setUnits(units) {
    this.base.setUnits(units);
  }

  stepsOf(rnd, replica) {
    const out = [];
    for (let h = 0; h < this.syncEvery; h++) out.push((rnd * this.syncEvery + h) * this.replicas + replica);
    return out;
  }

  /** The contribution of replicas `ids` to round `step` from `theta` (a snapshot of theta_g)
   *  and the inner moments held now (the round's start while `step` is the current round).
   *  `split(s)`: how step s's micro-batches are shared (default: one share). */
  async contribute(ids, step = this.step, theta = this.theta, split = null) {
    const { m, v, inner, b1t, b2t } = this; // apply installs new arrays: one consistent view
    const p = this.layout.size;
    const out = new Float64Array(this.totalSize);
    const loss = new Float64Array(ids.length);
    const correct = new Int32Array(ids.length);
    const all = Array.from({ length: nMicro(this.hp) }, (_, i) => i);
    const scale = pow2(DELTA_FRAC_BITS);
    for (let t = 0; t < ids.length; t++) {
      const j = ids[t];
      if (!(Number.isInteger(j) && j >= 0 && j < this.replicas)) throw new RangeError(`replica ${j} is not one of this run's ${this.replicas}`);
      const th = theta.slice();
      const adam = new AdamState(p);
      adam.m.set(m[j]);
      adam.v.set(v[j]);
      adam.step = inner;
      adam.b1t = b1t;
      adam.b2t = b2t;
      let lsum = 0;
      let ln = 0;
      for (const s of this.stepsOf(step, j)) {
        const total = new Float64Array(p);
        for (const part of split ? split(s) : [all]) {
          const r = await this.base.contribute(part, s, th);
          for (let i = 0; i < p; i++) total[i] += r.grad[i];
          for (let i = 0; i < r.loss.length; i++) { lsum += r.loss[i]; ln++; correct[t] += r.correct[i]; }
        }
        adamStep(th, adam, this.base.meanGrad(total), this.hp);
      }
      for (let i = 0; i < p; i++) {
        const q = Math.floor((theta[i] - th[i]) * scale + 0.5);
        out[i] += Math.min(Math.max(q, -this.limit), this.limit);
      }
      packMoments(adam.m, adam.v, out, p + 4 * p * j);
      loss[t] = ln ? lsum / ln : 0;
    }
    return { grad: out, loss, correct };
  }

  /** The outer step from a round's total, and every replica's new inner moments. */
  apply(total) {
    const p = this.layout.size;
    const r = this.replicas;
    const hp = this.hp;
    if (total.length !== this.totalSize) throw new RangeError(`a total of ${total.length} entries, the run's are ${this.totalSize}`);
    const m = [];
    const v = [];
    for (let j = 0; j < r; j++) {
      const got = unpackMoments(total, p + 4 * p * j, p);
      m.push(got.m);
      v.push(got.v);
    }
    const pow = (r & (r - 1)) === 0;
    const scale = pow ? pow2(-DELTA_FRAC_BITS - Math.round(Math.log2(r))) : pow2(-DELTA_FRAC_BITS);
    const mu = hp.outer_momentum;
    const lr = hp.outer_lr;
    const buf = new Float64Array(p);
    for (let i = 0; i < p; i++) {
      const d = pow ? total[i] * scale : (total[i] * scale) / r;
      buf[i] = this.outer[i] * mu + d;
      this.theta[i] = this.theta[i] - lr * (d + mu * buf[i]);
    }
    let b1t = this.b1t;
    let b2t = this.b2t;
    for (let h = 0; h < this.syncEvery; h++) {
      b1t = b1t * hp.beta1;
      b2t = b2t * hp.beta2;
    }
    this.outer = buf;
    this.m = m;
    this.v = v;
    this.inner += this.syncEvery;
    this.b1t = b1t;
    this.b2t = b2t;
    this.step += 1;
  }

  get totalSize() {
    return this._totalSize;
  }

  /** On the wire (STATE): theta is [theta_g | outer buffer], each moment part every
   *  replica's, replica after replica (local.py state_sizes). */
  get stateSizes() {
    return [2 * this.layout.size, this.replicas * this.layout.size];
  }

  wireState() {
    const p = this.layout.size;
    const theta = new Float64Array(2 * p);
    theta.set(this.theta);
    theta.set(this.outer, p);
    const flat = (arrs) => { const o = new Float64Array(this.replicas * p); arrs.forEach((a, j) => o.set(a, j * p)); return o; };
    return { step: this.step, theta, m: flat(this.m), v: flat(this.v), b1t: this.b1t, b2t: this.b2t };
  }

  stateOf(st) {
    const p = this.layout.size;
    const split = (a) => Array.from({ length: this.replicas }, (_, j) => Float64Array.from(a.subarray(j * p, (j + 1) * p)));
    const theta = Float64Array.from(st.theta);
    return { step: st.step, inner: st.step * this.syncEvery, theta: theta.subarray(0, p), outer: theta.subarray(p),
      m: split(Float64Array.from(st.m)), v: split(Float64Array.from(st.v)), b1t: st.b1t, b2t: st.b2t };
  }

  /** local.py contribution_error: null, or why a received contribution to replicas `micro`
   *  cannot be one (moments in a replica it was not given, halves that are not unsigned
   *  32-bit, moments that are not finite). */
  contributionError(ints, micro) {
    const p = this.layout.size;
    if (ints.length !== this.totalSize) return `not ${this.totalSize} integers`;
    const mine = new Set(micro);
    for (let j = 0; j < this.replicas; j++) {
      const at = p + 4 * p * j;
      if (!mine.has(j)) {
        for (let i = at; i < at + 4 * p; i++) if (ints[i] !== 0) return `moments of replica ${j}, which it was not given`;
        continue;
      }
      try {
        unpackMoments(ints, at, p);
      } catch (err) {
        return `replica ${j}: ${err.message}`;
      }
    }
    return null;
  }

  /** A copy of the whole round state. */
  snapshot() {
    return { step: this.step, inner: this.inner, theta: this.theta.slice(), outer: this.outer.slice(),
      m: this.m.map((a) => a.slice()), v: this.v.map((a) => a.slice()), b1t: this.b1t, b2t: this.b2t };
  }

  /** Replace the state with a copy of `st` (theta_g is written in place). */
  load(st) {
    const p = this.layout.size;
    const r = this.replicas;
    if (st.theta.length !== p || st.outer.length !== p || st.m.length !== r || st.v.length !== r ||
        st.m.some((a) => a.length !== p) || st.v.some((a) => a.length !== p)) {
      throw new RangeError(`a local state of another shape than this run's (${r} replicas of ${p} parameters)`);
    }
    if (st.inner !== st.step * this.syncEvery) throw new RangeError(`a local state at round ${st.step} with ${st.inner} inner steps`);
    this.theta.set(st.theta);
    this.outer = Float64Array.from(st.outer);
    this.m = st.m.map((a) => Float64Array.from(a));
    this.v = st.v.map((a) => Float64Array.from(a));
    this.step = st.step;
    this.inner = st.inner;
    this.b1t = st.b1t;
    this.b2t = st.b2t;
  }

  async paramsSha256() {
    return paramsSha256(this.theta);
  }

  async accuracy(split = "test") {
    return this.base.accuracy(split);
  }
}

/** The run's trainer (local.py make_trainer): a LocalTrainer for a local-steps run, else the
 *  synchronous Trainer. */
export async function makeTrainer(o) {
  return isLocal(o.hyper) ? LocalTrainer.create(o) : Trainer.create(o);
}

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
// Anchors (local.py): the moment blocks travel only in round n with (n + 1) % K == 0
// (K = MOMENTS_EVERY); its total installs them. Between anchors they are zero. Every device
// holds the anchor's moments and theta_g at the start of each round since (hist, at most
// K - 1); the device that computed replica j in round n keeps j's moments after it
// (this.own, keyed by n and theta_g at n's start, dropped on load); without them
// contribute replays j from the anchor through hist: the same bits either way.

import { adamStep, AdamState } from "./adam.js";
import { pow2 } from "./detmath.js";
import { isLocal, MOMENTS_EVERY, nMicro } from "./spec.js";
import { paramsSha256, Trainer } from "./trainer.js";

export const DELTA_FRAC_BITS = 32;
export { MOMENTS_EVERY } from "./spec.js"; // the default K (spec.py)
const TWO32 = 4294967296;

/** A round this trainer cannot compute now (local.py StaleRound): before its anchor (the room
 *  moved past it while the compute waited) or after its current round; mesh.js drops it. */
export class StaleRound extends RangeError {
  constructor(message) {
    super(message);
    this.name = "StaleRound";
  }
}

/** L = floor(2^51 / R). */
export const deltaLimit = (replicas) => Math.floor(2251799813685248 / replicas);

const scratch = new DataView(new ArrayBuffer(8));

/** beta1^n and beta2^n as adamStep's running products make them (local.py bias_products). */
export function biasProducts(beta1, beta2, n) {
  let b1t = 1.0;
  let b2t = 1.0;
  for (let i = 0; i < n; i++) { b1t = b1t * beta1; b2t = b2t * beta2; }
  return [b1t, b2t];
}

const sameBits = (a, b) => {
  if (a.length !== b.length) return false;
  const x = new Uint32Array(a.buffer, a.byteOffset, 2 * a.length);
  const y = new Uint32Array(b.buffer, b.byteOffset, 2 * b.length);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
  return true;
};

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
    this.momentsEvery = this.hp.moments_every ?? MOMENTS_EVERY; // K, --moments-every
    this.hist = []; // theta_g at the start of each round since the anchor
    this.own = new Map(); // replica -> {round, theta (theta_g at its start), m, v}: never sent between anchors
    this.replayed = 0; // replica rounds recomputed from the anchor
  }

  /** Whether round `rnd`'s contributions and total carry the moments. */
  isAnchor(rnd) {
    return (rnd + 1) % this.momentsEvery === 0;
  }

  setUnits(units) {
    this.base.setUnits(units);
  }

  stepsOf(rnd, replica) {
    const out = [];
    for (let h = 0; h < this.syncEvery; h++) out.push((rnd * this.syncEvery + h) * this.replicas + replica);
    return out;
  }

  /** Replica j's H inner steps of round `rnd` from `theta` (`adam` advances); the losses
   *  and correct counts add to `acc`. */
  async _round(j, rnd, theta, adam, split, acc) {
    const p = this.layout.size;
    const all = Array.from({ length: nMicro(this.hp) }, (_, i) => i);
    const th = theta.slice();
    const [gscale, gdiv] = this.base.gradScaling();
    for (const s of this.stepsOf(rnd, j)) {
      const total = new Float64Array(p);
      for (const part of split ? split(s) : [all]) {
        const r = await this.base.contribute(part, s, th);
        for (let i = 0; i < p; i++) total[i] += r.grad[i];
        for (let i = 0; i < r.loss.length; i++) { acc.lsum += r.loss[i]; acc.ln++; acc.correct += r.correct[i]; }
      }
      adamStep(th, adam, total, this.hp, gscale, gdiv);
    }
    return th;
  }

  /** Replica j's Adam state at round `rnd`'s start (local.py _start): its own moments
   *  after round rnd - 1 when they follow hist, else replayed from the anchor. */
  async _start(st, j, rnd, split) {
    const p = this.layout.size;
    const H = this.syncEvery;
    const a = st.step - (st.step % this.momentsEvery);
    if (!(Number.isInteger(rnd) && rnd >= a && rnd <= st.step) || st.hist.length !== st.step - a) {
      throw new StaleRound(`round ${rnd} is not between this trainer's anchor ${a} and round ${st.step}`);
    }
    const make = (m, v, n, b) => {
      const adam = new AdamState(p);
      adam.m.set(m);
      adam.v.set(v);
      adam.step = n;
      [adam.b1t, adam.b2t] = b;
      return adam;
    };
    if (rnd > a) {
      const mine = this.own.get(j);
      if (mine && mine.round === rnd - 1 && sameBits(mine.theta, st.hist[rnd - 1 - a])) {
        const b = rnd === st.step ? [st.b1t, st.b2t] : biasProducts(this.hp.beta1, this.hp.beta2, rnd * H);
        return make(mine.m, mine.v, rnd * H, b);
      }
    }
    // st's bias products are round st.step's: the anchor's only while st.step is the anchor
    // (a late compute of round a after the trainer moved on replays from the anchor's)
    const b = st.step === a ? [st.b1t, st.b2t] : biasProducts(this.hp.beta1, this.hp.beta2, a * H);
    const adam = make(st.m[j], st.v[j], a * H, b);
    for (let n = a; n < rnd; n++) {
      await this._round(j, n, st.hist[n - a], adam, split, { lsum: 0, ln: 0, correct: 0 });
      this.replayed++;
    }
    return adam;
  }

  /** The contribution of replicas `ids` to round `step` (any round since the anchor) from
   *  `theta` (a snapshot of theta_g); a replica's moments at the round's start are this
   *  device's own or replayed from the anchor. `split(s)`: how step s's micro-batches are
   *  shared (default: one share). */
  async contribute(ids, step = this.step, theta = this.theta, split = null) {
    const st = { step: this.step, hist: this.hist, m: this.m, v: this.v, b1t: this.b1t, b2t: this.b2t }; // one consistent view
    const p = this.layout.size;
    const out = new Float64Array(this.totalSize);
    const loss = new Float64Array(ids.length);
    const correct = new Int32Array(ids.length);
    const scale = pow2(DELTA_FRAC_BITS);
    const at0 = theta.slice();
    for (let t = 0; t < ids.length; t++) {
      const j = ids[t];
      if (!(Number.isInteger(j) && j >= 0 && j < this.replicas)) throw new RangeError(`replica ${j} is not one of this run's ${this.replicas}`);
      const adam = await this._start(st, j, step, split);
      const acc = { lsum: 0, ln: 0, correct: 0 };
      const th = await this._round(j, step, at0, adam, split, acc);
      this.own.set(j, { round: step, theta: at0, m: adam.m.slice(), v: adam.v.slice() });
      for (let i = 0; i < p; i++) {
        const q = Math.floor((at0[i] - th[i]) * scale + 0.5);
        out[i] += Math.min(Math.max(q, -this.limit), this.limit);
      }
      if (this.isAnchor(step)) packMoments(adam.m, adam.v, out, p + 4 * p * j);
      loss[t] = acc.ln ? acc.lsum / acc.ln : 0;
      correct[t] = acc.correct;
    }
    return { grad: out, loss, correct };
  }

  /** The outer step from a round's total; an anchor round's installs every replica's new
   *  inner moments, another's (moment blocks all zero) adds theta_g to hist. */
  apply(total) {
    const p = this.layout.size;
    const r = this.replicas;
    const hp = this.hp;
    if (total.length !== this.totalSize) throw new RangeError(`a total of ${total.length} entries, the run's are ${this.totalSize}`);
    const anchor = this.isAnchor(this.step);
    const m = [];
    const v = [];
    if (anchor) {
      for (let j = 0; j < r; j++) {
        const got = unpackMoments(total, p + 4 * p * j, p);
        m.push(got.m);
        v.push(got.v);
      }
    } else {
      for (let i = p; i < total.length; i++) if (total[i] !== 0) throw new RangeError("the total carries moments in a round between anchors");
    }
    const before = this.theta.slice();
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
    if (anchor) {
      this.m = m;
      this.v = v;
      this.hist = [];
    } else {
      this.hist = [...this.hist, before];
    }
    this.inner += this.syncEvery;
    this.b1t = b1t;
    this.b2t = b2t;
    this.step += 1;
  }

  get totalSize() {
    return this._totalSize;
  }

  /** On the wire (STATE): theta is [theta_g | outer buffer | hist, K - 1 rows, unused ones
   *  zero], each moment part every replica's at the anchor (local.py state_sizes). */
  get stateSizes() {
    return [(1 + this.momentsEvery) * this.layout.size, this.replicas * this.layout.size];
  }

  wireState() {
    const p = this.layout.size;
    const theta = new Float64Array(this.stateSizes[0]);
    theta.set(this.theta);
    theta.set(this.outer, p);
    this.hist.forEach((h, i) => theta.set(h, (2 + i) * p));
    const flat = (arrs) => { const o = new Float64Array(this.replicas * p); arrs.forEach((a, j) => o.set(a, j * p)); return o; };
    return { step: this.step, theta, m: flat(this.m), v: flat(this.v), b1t: this.b1t, b2t: this.b2t };
  }

  stateOf(st) {
    const p = this.layout.size;
    const split = (a) => Array.from({ length: this.replicas }, (_, j) => Float64Array.from(a.subarray(j * p, (j + 1) * p)));
    const theta = Float64Array.from(st.theta);
    const hist = Array.from({ length: st.step % this.momentsEvery }, (_, i) => theta.slice((2 + i) * p, (3 + i) * p));
    return { step: st.step, inner: st.step * this.syncEvery, theta: theta.subarray(0, p), outer: theta.subarray(p, 2 * p),
      m: split(Float64Array.from(st.m)), v: split(Float64Array.from(st.v)), b1t: st.b1t, b2t: st.b2t, hist };
  }

  /** local.py contribution_error: null, or why a received contribution to replicas `micro`
   *  cannot be one (moments in a replica it was not given, halves that are not unsigned
   *  32-bit, moments that are not finite). */
  contributionError(ints, micro, step = this.step) {
    const p = this.layout.size;
    if (ints.length !== this.totalSize) return `not ${this.totalSize} integers`;
    const anchor = this.isAnchor(step);
    const mine = new Set(anchor ? micro : []);
    for (let j = 0; j < this.replicas; j++) {
      const at = p + 4 * p * j;
      if (!mine.has(j)) {
        const why = anchor ? `moments of replica ${j}, which it was not given` : `moments of replica ${j} in a round between anchors`;
        for (let i = at; i < at + 4 * p; i++) if (ints[i] !== 0) return why;
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
      m: this.m.map((a) => a.slice()), v: this.v.map((a) => a.slice()), b1t: this.b1t, b2t: this.b2t,
      hist: this.hist.map((a) => a.slice()) };
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
    const hist = st.hist || [];
    const n = st.step % this.momentsEvery;
    if (hist.length !== n || hist.some((a) => a.length !== p)) {
      throw new RangeError(`a local state at round ${st.step} needs theta_g of the ${n} round(s) since its anchor, it holds ${hist.length}`);
    }
    this.theta.set(st.theta);
    this.outer = Float64Array.from(st.outer);
    this.m = st.m.map((a) => Float64Array.from(a));
    this.v = st.v.map((a) => Float64Array.from(a));
    this.step = st.step;
    this.inner = st.inner;
    this.b1t = st.b1t;
    this.b2t = st.b2t;
    this.hist = hist.map((a) => Float64Array.from(a));
    this.own = new Map();
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

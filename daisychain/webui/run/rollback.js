// The rollback window of a coordinator (daisychain/peer/run/rollback.py): one snapshot of the state
// at the window's first step and the integer total of every committed step since (with who
// sent unchecked contributions in it, stored NARROW or VARINT as on the wire), the last
// windowSteps(rate, strikes) steps (up to 1.25 times that: the oldest quarter is folded into
// the snapshot at once); going back to step S is loading the snapshot and applying the
// totals before S again.

import { Codec } from "../wire/framing.js";
import { decodeInts, encodeInts } from "../wire/intcodec.js";

/** The chance, at most, that a liar stays unremoved for longer than the window. */
export const ESCAPE = 1e-6;
export const MAX_WINDOW = 100000;
/** The most a window's totals hold (bytes): past it the oldest are folded into the snapshot. */
export const MAX_WINDOW_BYTES = 256 * 2 ** 20;

// Exact powers of two that move a scaled number's mantissa 32 binary places at a time.
const BIG = 4294967296.0;              // 2**32
const SMALL = 2.3283064365386963e-10;  // 2**-32
/** Terms of the escape sum more than this many binary places under the largest are left out. */
const DROP = 1000;

/** [m, e] as the same number m * 2**e with 1/2 <= m < 1 ([0, 0] for 0): only products with
 * powers of two, which are exact (rollback.py _scaled). */
function scaled(m, e) {
  if (m === 0) return [0, 0];
  while (m >= BIG) { m = m * SMALL; e = e + 32; }
  while (m < SMALL) { m = m * BIG; e = e - 32; }
  while (m >= 1.0) { m = m * 0.5; e = e + 1; }
  while (m < 0.5) { m = m * 2.0; e = e - 1; }
  return [m, e];
}

const times = (a, b) => scaled(a[0] * b[0], a[1] + b[1]);

/** x**n, scaled, by repeated squaring (the bits of n from the lowest). */
function power(x, n) {
  let acc = [0.5, 1];
  let base = scaled(x, 0);
  while (n > 0) {
    if (n % 2 === 1) acc = times(acc, base);
    base = times(base, base);
    n = Math.floor(n / 2);
  }
  return acc;
}

/** 2**-d (0 <= d <= DROP), exactly. */
function halfPower(d) {
  let acc = 1.0;
  let base = 0.5;
  while (d > 0) {
    if (d % 2 === 1) acc = acc * base;
    base = base * base;
    d = Math.floor(d / 2);
  }
  return acc;
}

/** P(fewer than `strikes` of `k` steps checked), each with probability `rate` (0 < rate < 1),
 * as a scaled number [m, e] = m * 2**e: the binomial terms built by running products and summed
 * from the largest's binary place, with + - * / and comparisons only (DETERMINISM.md rule 7),
 * in the order of rollback.py escape_probability: the same bits in both languages. */
export function escapeProbability(k, rate, strikes) {
  const q = 1.0 - rate;
  let t = power(q, k);
  const terms = [t];
  for (let i = 0; i < Math.min(strikes, k + 1) - 1; i++) {
    let m = t[0] * (k - i);
    m = m / (i + 1);
    m = m * rate;
    m = m / q;
    t = scaled(m, t[1]);
    terms.push(t);
  }
  let top = null;
  for (const [m, e] of terms) if (m !== 0 && (top === null || e > top)) top = e;
  if (top === null) return [0, 0];
  let acc = 0.0;
  for (const [m, e] of terms) if (m !== 0 && top - e <= DROP) acc = acc + m * halfPower(top - e);
  return scaled(acc, top);
}

/** a < b for scaled numbers (b not 0). */
const below = (a, b) => a[0] === 0 || a[1] < b[1] || (a[1] === b[1] && a[0] < b[0]);

/** The smallest k with P(fewer than `strikes` of k steps checked) < `escape` (each step
 * checked with probability `rate`); 0 when nothing is checked, at most MAX_WINDOW. By
 * bisection from a k where P >= 1/2 (rollback.py window_steps). */
export function windowSteps(rate, strikes, escape = ESCAPE) {
  if (!(rate > 0)) return 0;
  if (rate >= 1) return strikes;
  const goal = scaled(escape, 0);
  const under = (k) => below(escapeProbability(k, rate, strikes), goal);
  const median = (strikes - 1) / rate; // Infinity for a subnormal rate: no window reaches it
  if (median >= MAX_WINDOW || !under(MAX_WINDOW)) return MAX_WINDOW;
  let lo = Math.max(strikes, Math.floor(median));
  if (under(lo)) return lo;
  let hi = MAX_WINDOW;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (under(mid)) hi = mid;
    else lo = mid;
  }
  return hi;
}

export class Window {
  constructor(size, bounds = null, maxBytes = MAX_WINDOW_BYTES) {
    this.size = size;
    this.bounds = bounds;
    this.maxBytes = maxBytes;
    this.held = 0;     // bytes of the encoded totals
    this.base = null;  // a Trainer.snapshot() at the window's first step
    this.steps = [];   // [{step, codec, body, unchecked: Set}]
    this.tainted = new Map(); // params hash -> the liar: states a rollback undid (no restore to one)
  }

  /** The earliest step the window can go back to (null: none). */
  get first() { return this.base ? this.base.step : null; }

  /** Start the window at the replica's current state (a new term, a restore). */
  async reset(trainer) {
    this.base = this.size ? await trainer.snapshot() : null;
    this.steps = [];
    this.held = 0;
  }

  /** `total` was applied at `step`; past 1.25 times the window, the oldest quarter is
   * folded into the snapshot (applied to it); past maxBytes of totals, the oldest quarter of those held.
   * `encoded`: the total's {codec, body} as it travels (rollback.py record), else encoded here. */
  async record(trainer, step, total, unchecked, encoded = null) {
    if (!this.base) return;
    const { codec, body } = encoded ?? this.encode(total);
    this.steps.push({ step, codec, body, unchecked: new Set(unchecked) });
    this.held += body.length;
    let chunk = Math.max(1, Math.floor(this.size / 4));
    if (this.held > this.maxBytes) chunk = Math.max(1, Math.floor(this.steps.length / 4));
    else if (this.steps.length < this.size + chunk) chunk = 0;
    if (chunk) {
      const old = this.steps.splice(0, chunk);
      for (const s of old) this.held -= s.body.length;
      const now = await trainer.snapshot();
      await trainer.load(this.base);
      for (const s of old) await trainer.apply(await decodeInts(s.codec, s.body, trainer.totalSize));
      this.base = await trainer.snapshot();
      await trainer.load(now);
    }
  }

  /** A total as the window holds it and a TOTAL carries it (rollback.py encode). */
  encode(total) {
    return encodeInts(total, this.bounds, [Codec.NARROW, Codec.VARINT]);
  }

  /** The first step in the window with an unchecked contribution of `peer` (or null). */
  earliest(peer) {
    const s = this.steps.find((x) => x.unchecked.has(peer));
    return s ? s.step : null;
  }

  /** Load the state the run had at `step` (within the window); forget the steps from there;
   * the states after them are remembered as `liar`'s (tainted: rollback.py go_back). */
  async goBack(trainer, step, liar = "") {
    await trainer.load(this.base);
    const keep = this.steps.filter((s) => s.step < step);
    for (const s of keep) await trainer.apply(await decodeInts(s.codec, s.body, trainer.totalSize));
    const back = await trainer.snapshot();
    for (const s of this.steps.slice(keep.length)) {
      await trainer.apply(await decodeInts(s.codec, s.body, trainer.totalSize));
      this.tainted.set(await trainer.paramsSha256(), liar);
    }
    await trainer.load(back);
    this.steps = keep;
    this.held = keep.reduce((a, s) => a + s.body.length, 0);
  }

  /** rollback.py rebase: the replica just loaded a whole state (a restore, a sync, a
   * catch-up): keep the steps before it when the window leads to that same state, else start
   * again at the loaded state. True when the steps were kept. */
  async rebase(trainer) {
    const at = trainer.step;
    const now = await trainer.snapshot();
    const sha = await trainer.paramsSha256();
    let ok = false;
    const last = this.steps.length ? this.steps[this.steps.length - 1].step + 1 : this.base?.step;
    if (this.base && this.base.step <= at && at <= last) {
      await trainer.load(this.base);
      for (const s of this.steps) if (s.step < at) await trainer.apply(await decodeInts(s.codec, s.body, trainer.totalSize));
      ok = trainer.step === at && (await trainer.paramsSha256()) === sha;
      await trainer.load(now);
    }
    if (!ok) {
      await this.reset(trainer);
      return false;
    }
    this.steps = this.steps.filter((s) => s.step < at);
    this.held = this.steps.reduce((a, s) => a + s.body.length, 0);
    return true;
  }

  /** rollback.py unchecked_since: peer -> the first step in the window with an unchecked
   * contribution of it. */
  uncheckedSince() {
    const out = new Map();
    for (const s of this.steps) for (const p of [...s.unchecked].sort()) if (!out.has(p)) out.set(p, s.step);
    return out;
  }

  /** Bytes the window holds: the snapshot and the totals. */
  bytes() {
    if (!this.base) return 0;
    return this.base.theta.length * 3 * 8 + this.steps.reduce((a, s) => a + s.body.length, 0);
  }
}

// The rollback window of a coordinator (daisychain/peer/run/rollback.py): one snapshot of the state
// at the window's first step and the integer total of every committed step since (with who
// sent unchecked contributions in it, stored NARROW or VARINT as on the wire), the last
// windowSteps(rate, strikes) steps (up to 1.25 times that: the oldest quarter is folded into
// the snapshot at once); going back to step S is loading the snapshot and applying the
// totals before S again.

import { Codec } from "../framing.js";
import { decodeInts, encodeInts } from "../intcodec.js";

/** The chance, at most, that a liar stays unremoved for longer than the window. */
export const ESCAPE = 1e-6;
export const MAX_WINDOW = 100000;
/** The most a window's totals hold (bytes): past it the oldest are folded into the snapshot. */
export const MAX_WINDOW_BYTES = 256 * 2 ** 20;

/** log P(fewer than `strikes` of `k` steps checked), each with probability `rate`, summed in
 * log space (rollback.py log_escape, the same float operations). */
export function logEscape(k, rate, strikes) {
  const lq = Math.log1p(-rate);
  const lr = Math.log(rate);
  let lt = k * lq;
  const terms = [lt];
  for (let i = 0; i < Math.min(strikes, k + 1) - 1; i++) {
    lt += Math.log((k - i) / (i + 1)) + lr - lq;
    terms.push(lt);
  }
  const top = Math.max(...terms);
  let acc = 0.0;
  for (const t of terms) acc += Math.exp(t - top);
  return top + Math.log(acc);
}

/** The smallest k with P(fewer than `strikes` of k steps checked) < `escape` (each step
 * checked with probability `rate`); 0 when nothing is checked, at most MAX_WINDOW. By
 * bisection from a k where P >= 1/2 (rollback.py window_steps). */
export function windowSteps(rate, strikes, escape = ESCAPE) {
  if (!(rate > 0)) return 0;
  if (rate >= 1) return strikes;
  const goal = Math.log(escape);
  let lo = Math.max(strikes, Math.floor((strikes - 1) / rate));
  if (lo >= MAX_WINDOW || logEscape(MAX_WINDOW, rate, strikes) >= goal) return MAX_WINDOW;
  if (logEscape(lo, rate, strikes) < goal) return lo;
  let hi = MAX_WINDOW;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (logEscape(mid, rate, strikes) < goal) hi = mid;
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
   * folded into the snapshot (applied to it); past maxBytes of totals, the oldest quarter of those held. */
  async record(trainer, step, total, unchecked) {
    if (!this.base) return;
    const { codec, body } = encodeInts(total, this.bounds, [Codec.NARROW, Codec.VARINT]);
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

  /** The first step in the window with an unchecked contribution of `peer` (or null). */
  earliest(peer) {
    const s = this.steps.find((x) => x.unchecked.has(peer));
    return s ? s.step : null;
  }

  /** Load the state the run had at `step` (within the window); forget the steps from there. */
  async goBack(trainer, step) {
    await trainer.load(this.base);
    const keep = this.steps.filter((s) => s.step < step);
    for (const s of keep) await trainer.apply(await decodeInts(s.codec, s.body, trainer.totalSize));
    this.steps = keep;
    this.held = keep.reduce((a, s) => a + s.body.length, 0);
  }

  /** Bytes the window holds: the snapshot and the totals. */
  bytes() {
    if (!this.base) return 0;
    return this.base.theta.length * 3 * 8 + this.steps.reduce((a, s) => a + s.body.length, 0);
  }
}

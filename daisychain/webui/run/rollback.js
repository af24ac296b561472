// The rollback window of a coordinator (run.py's run/rollback.py): one snapshot of the state
// at the window's first step and the integer total of every committed step since (with who
// sent unchecked contributions in it), the last windowSteps(rate, strikes) steps; going back
// to step S is loading the snapshot and applying the totals before S again.

/** The chance, at most, that a liar stays unremoved for longer than the window. */
export const ESCAPE = 1e-6;
export const MAX_WINDOW = 100000;

/** The smallest k with P(fewer than `strikes` of k steps checked) < `escape` (each step
 * checked with probability `rate`); 0 when nothing is checked. The same float operations
 * as rollback.py window_steps. */
export function windowSteps(rate, strikes, escape = ESCAPE) {
  if (!(rate > 0)) return 0;
  if (rate >= 1) return strikes;
  const q = 1.0 - rate;
  let qk = 1.0;
  for (let i = 0; i < strikes; i++) qk *= q;
  let k = strikes;
  while (k < MAX_WINDOW) {
    let term = qk;
    let acc = 0.0;
    for (let i = 0; i < strikes; i++) {
      acc += term;
      term = term * (k - i) / (i + 1) * rate / q;
    }
    if (acc < escape) return k;
    k += 1;
    qk *= q;
  }
  return MAX_WINDOW;
}

export class Window {
  constructor(size) {
    this.size = size;
    this.base = null;  // a Trainer.snapshot() at the window's first step
    this.steps = [];   // [{step, total, unchecked: Set}]
  }

  /** The earliest step the window can go back to (null: none). */
  get first() { return this.base ? this.base.step : null; }

  /** Start the window at the replica's current state (a new term, a restore). */
  async reset(trainer) {
    this.base = this.size ? await trainer.snapshot() : null;
    this.steps = [];
  }

  /** `total` was applied at `step`; the oldest step beyond the window is folded into the
   * snapshot (applied to it). */
  async record(trainer, step, total, unchecked) {
    if (!this.base) return;
    this.steps.push({ step, total: Float64Array.from(total), unchecked: new Set(unchecked) });
    if (this.steps.length > this.size) {
      const old = this.steps.shift();
      const now = await trainer.snapshot();
      await trainer.load(this.base);
      await trainer.apply(old.total);
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
    for (const s of keep) await trainer.apply(s.total);
    this.steps = keep;
  }

  /** Bytes the window holds: the snapshot and the totals. */
  bytes() {
    if (!this.base) return 0;
    return (this.base.theta.length * 3 + this.steps.reduce((a, s) => a + s.total.length, 0)) * 8;
  }
}

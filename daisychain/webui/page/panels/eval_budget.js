// The page's live views of a run (the test-accuracy curve, run.js; the gallery's predictions,
// gallery.js) compute on the worker that computes the run's micro-batches. Taken every few
// steps whatever they cost, they took ~30% of a solo tab's step on the default CNN (a step of
// 72 ms without them, 103 ms with them; docs/BENCHMARKS.md "Where a tab's step goes"), and
// in a room a member's views delay its share of every step. So each view has a budget: after
// it took d ms (its round trip to the worker, waiting included), it waits until its time is
// at most its share of the time since, d * (1 / share - 1) ms; the two views' shares add up
// to SHARE. Each is due at once at first, so both show early in a run. The run's bits never
// depend on it: a view reads a copy of the parameters.

/** The most of a worker's time the live views together may take. */
export const SHARE = 0.1;

/** A run's first this many points of each view are taken at their steps whatever they cost,
 *  so a short run's chart and gallery still show its progress (a 30-step run: 4 points). */
export const FREE_VIEWS = 4;

export class ViewBudget {
  constructor(share = SHARE, now = () => performance.now()) {
    this.share = share;
    this.now = now;
    this.notBefore = 0;
  }

  /** Whether a view may start now: the `taken`-th of its run (free while taken < FREE_VIEWS),
   *  or its budget allows it. */
  due(taken = FREE_VIEWS) {
    return taken < FREE_VIEWS || this.now() >= this.notBefore;
  }

  /** Run `view` (a function returning a promise) and charge its time to the budget; with
   *  `before` (a function returning a promise: the mesh's computeIdle), once that is done, so
   *  that a view never sits on the compute worker ahead of the step's own share (in a room
   *  it then runs while this tab waits for the others: off the step's critical path). */
  async charge(view, before = null) {
    if (before) await before();
    const t0 = this.now();
    try {
      return await view();
    } finally {
      const t1 = this.now();
      this.notBefore = Math.max(this.notBefore, t1 + (t1 - t0) * (1 / this.share - 1));
    }
  }
}

/** The budgets of the page's two live views, half of SHARE each. */
export const accuracyView = new ViewBudget(SHARE / 2);
export const galleryView = new ViewBudget(SHARE / 2);

// How a step's contributions become its total (daisychain/peer/run/aggregator.py). Star: every
// contribution comes to the coordinator, which sums them (each micro-batch exactly once; a
// spot-checked one from its reference answer) and sends the total to everyone. Another
// topology (a ring) plugs in here with the same `total` answer.

import { sameInts } from "./util.js";

export class Star {
  /** tasks: the step's tasks (their kind "main" results count); checks: micro-batch -> its
   * decided check. Returns {total, contributors (sorted [peer, micro-batches]), loss (the
   * mean over micro-batches), unchecked (peers other than `me` whose contribution in the
   * total no spot-check confirmed)}. */
  total(tasks, checks, size, me) {
    const total = new Float64Array(size);
    const per = {};
    const unchecked = new Set();
    let lossSum = 0;
    let n = 0;
    const mains = [...tasks].filter((t) => t.kind === "main").sort((a, b) => a.task - b.task);
    for (const t of mains) {
      let { peer, ints, loss } = t.result;
      const c = t.micro.length === 1 ? checks.get(t.micro[0]) : undefined;
      if (c) { // a spot-checked micro-batch: the reference answer counts
        loss = c.decided.loss;
        if (!sameInts(ints, c.decided.ints)) {
          peer = c.decidedBy;
          ints = c.decided.ints;
        }
        if (c.votes.size < 2 && peer !== me) unchecked.add(peer); // one answer, nobody confirmed it
      } else if (peer !== me) {
        unchecked.add(peer);
      }
      for (let i = 0; i < size; i++) total[i] += ints[i];
      per[peer] = (per[peer] || 0) + t.micro.length;
      lossSum += loss;
      n += t.micro.length; // loss: the mean over micro-batches of their mean (as daisychain train)
    }
    const contributors = Object.entries(per).sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    return { total, contributors, loss: lossSum / Math.max(n, 1), unchecked };
  }
}

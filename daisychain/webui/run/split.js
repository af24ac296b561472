// How a step's micro-batches are shared (daisychain/peer/run/split.py): by capacity, or once a
// member's link is seen to cost time, so that everyone finishes together.

/** trainer.py capacity_split: contiguous shares proportional to capacity (largest remainder). */
export function capacitySplit(ids, caps) {
  const total = caps.reduce((s, c) => s + c, 0);
  const n = ids.length;
  const exact = caps.map((c) => (c / total) * n);
  const counts = exact.map((e) => Math.floor(e));
  const order = caps.map((_, k) => k).sort((x, y) => (counts[x] - exact[x]) - (counts[y] - exact[y]) || x - y);
  const missing = n - counts.reduce((s, c) => s + c, 0);
  for (const k of order.slice(0, missing)) counts[k] += 1;
  const out = [];
  let i = 0;
  for (const c of counts) {
    out.push(ids.slice(i, i + c));
    i += c;
  }
  return out;
}

/** run/split.py split_tasks: the step's parts (capacitySplit of ids by weights); with `last`
 *  (a local-steps run: Map replica -> the peer that computed it last round) the same count per
 *  peer, each replica kept by its last peer while that peer has room (sticky replicas: no
 *  replay), the others in order to the first peers with room; each part ascending. Returns
 *  {parts, owner: Map replica -> peer} (shared cases: tests/scenarios/split.json "sticky"). */
export function splitTasks(ids, weights, live, last = null) {
  let parts = capacitySplit(ids, weights);
  if (last) {
    const counts = parts.map((p) => p.length);
    parts = live.map(() => []);
    const left = [];
    for (const j of ids) {
      const k = last.has(j) ? live.indexOf(last.get(j)) : -1;
      (k >= 0 && parts[k].length < counts[k] ? parts[k] : left).push(j);
    }
    let k = 0;
    for (const j of left) {
      while (parts[k].length >= counts[k]) k++;
      parts[k].push(j);
    }
    parts = parts.map((p) => p.sort((x, y) => x - y));
  }
  const owner = new Map();
  live.forEach((peer, k) => { for (const j of parts[k]) owner.set(j, peer); });
  return { parts, owner };
}

/** run/split.py finish_shares: micro-batch shares (summing to ~n) with which every peer finishes
 * a step at the same time T: peer k takes max(1, (T - fixed[k]) / spm[k]) micro-batches
 * (spm: seconds per micro-batch, fixed: seconds its link adds to a step). T by bisection,
 * the same float operations as Python (shared cases: tests/scenarios/split.json). */
export function finishShares(spm, fixed, n) {
  const taken = (t) => {
    let acc = 0.0;
    for (let k = 0; k < spm.length; k++) acc += Math.max(1.0, (t - fixed[k]) / spm[k]);
    return acc;
  };
  let lo = 0.0;
  let hi = Math.max(...fixed) + n * Math.max(...spm);
  for (let i = 0; i < 100; i++) {
    const mid = 0.5 * (lo + hi);
    if (taken(mid) >= n) hi = mid;
    else lo = mid;
  }
  return spm.map((s, k) => Math.max(1.0, (hi - fixed[k]) / s));
}

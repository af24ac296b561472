// How a step's contributions become its total (daisychain/peer/run/aggregator.py): the
// Aggregation interface of the coordinator and its member-side counterpart MemberAggregation,
// and the star behind them. The roles call only the interface (coordinator.aggregation,
// member.aggregation) and never ask which topology sums a step.
// - Star: every contribution comes to the coordinator, which sums them (each micro-batch
//   exactly once; a spot-checked one from its reference answer) and sends the total to
//   everyone. Its book of the step (tasks, checks, backups, the commit) is the coordinator's,
//   which the trust checks share.
// - StarMember: a member sends its contribution to the coordinator.
// - The ring (ring_roles.js): RingCoordinator and RingMember implement the same interfaces.
//   They hold a star and hand it the steps that the ring does not sum (the choice per step:
//   ring.js choose; --aggregate star: every step).

import { checkedMicro } from "./checks.js";
import { capacitySplit, splitTasks } from "./split.js";
import { g3, log, pyList, sameInts, send } from "./util.js";

/** The coordinator's side of a step's sum. Every method returns the outputs of what it did
 * (drop: nothing). */
export class Aggregation {
  /** Start the step with `live` (self first): split it, tell the members. */
  begin(live) { throw new Error("not implemented"); }
  /** The coordinator's own share `task` of `step` is computed. */
  async computed(step, task, micro, grad, loss, correct) { throw new Error("not implemented"); }
  /** A message of this aggregation (the driver routes them here). */
  async onMessage(sender, msg) { return []; }
  /** `peer` left (`gone`: its record, if it had one; `quiet`: no line for it). */
  async memberLeft(peer, gone, quiet) { throw new Error("not implemented"); }
  /** The clock moved: work past its deadline. */
  async deadline() { return []; }
  /** Work under way is dropped (a new term, a restore, a catch-up). */
  drop() {}
  /** What a member that asked for the state needs besides it to take part in the step. */
  resend(peer) { return []; }
}

/** A member's side of a step's sum (the interface; see Aggregation). */
export class MemberAggregation {
  /** This replica's share `task` of `step` is computed. */
  async computed(step, task, micro, grad, loss, correct) { throw new Error("not implemented"); }
  async onMessage(sender, msg) { return []; }
  /** Work under way is dropped (a new term, this peer leads, a restore). */
  drop() {}
  /** A state was loaded. */
  async synced() { return []; }
  /** Whether the run's `end` waits for a total still under way (kept, then). */
  holdsEnd(msg) { return false; }
  /** The room changed or a channel closed. */
  peersChanged() { return []; }
}

/** A member of a star: its contribution goes to the coordinator. */
export class StarMember extends MemberAggregation {
  constructor(member) {
    super();
    this.member = member;
  }

  async computed(step, task, micro, grad, loss, correct) {
    const m = this.member;
    return [send(m.coord, { T: "contrib", term: m.term, step, task, micro, loss, correct, ints: grad })];
  }
}

/** The star, over the coordinator c's book of the step (tasks, checks). */
export class Star extends Aggregation {
  constructor(coordinator) {
    super();
    this.c = coordinator;
  }

  /** Split the step by capacity (sticky replicas for local steps), spot-check some
   * micro-batches with a second peer, and dispatch. */
  begin(live) {
    const c = this.c;
    c.stepStarted = true;
    c.tasks = new Map();
    c.checks = new Map();
    const n = c.trainer.nTasks; // micro-batches; a local-steps run's replicas
    const ids = Array.from({ length: n }, (_, j) => j);
    const last = c.trainer.replicas !== undefined ? (c.owner ?? new Map()) : null; // local steps: sticky replicas
    const { parts, owner } = splitTasks(ids, c._splitWeights(live, n), live, last);
    c.owner = owner;
    const checked = new Set(live.length > 1 ? checkedMicro(c.peer.verifyKey, c.step, n, c.verifyRate) : []);
    const fresh = [];
    const out = [];
    live.forEach((peer, i) => {
      const micro = parts[i];
      const plain = micro.filter((j) => !checked.has(j));
      if (plain.length) fresh.push(c._newTask(peer, plain));
      for (const j of micro) {
        if (checked.has(j)) { // its own task, and the same micro-batch for the next peer
          c.checks.set(j, { micro: j, votes: new Map(), decided: null, decidedBy: null, refereed: false });
          fresh.push(c._newTask(peer, [j]));
          fresh.push(c._newTask(live[(i + 1) % live.length], [j], "check"));
        }
      }
      if (!micro.length) { // the coordinator too: in a local-steps room of more peers than replicas it may be the one
        const sum = live.reduce((s, p) => s + c._cap(p), 0);
        out.push(log(`${c._name(peer)} gets no micro-batch of step ${c.step}: its capacity ${g3(c._cap(peer))} micro-batches/s is under 1/${n} of the room's ${g3(sum)}`));
      }
    });
    return [...out, ...c._dispatch(fresh)];
  }

  async computed(step, task, micro, grad, loss, correct) {
    return this.c._takeContrib(this.c.me, step, task, micro, grad, loss, correct);
  }

  /** Its open tasks go to the others (split by capacity); checks it would have answered
   * decide with the others. */
  async memberLeft(peer, gone, quiet) {
    const c = this.c;
    const orphans = [];
    for (const t of c.tasks.values()) {
      const i = t.assignees.indexOf(peer);
      if (!t.result && i >= 0) {
        t.assignees.splice(i, 1);
        if (!t.assignees.length) orphans.push(t);
      }
    }
    const out = [];
    if (!orphans.length) {
      if (!quiet && gone) out.push(log(`${c._name(peer)} left`));
    } else {
      const live = c._live();
      const fresh = [];
      for (const t of orphans) { // split its micro-batches over those still here
        c.tasks.delete(t.task);
        if (t.kind !== "main") continue; // a second opinion nobody gives: the check decides with the others
        const parts = capacitySplit(t.micro, live.map((p) => c._cap(p)));
        live.forEach((who, i) => { if (parts[i].length) fresh.push(c._newTask(who, parts[i])); });
      }
      const mains = orphans.filter((t) => t.kind === "main").flatMap((t) => t.micro);
      if (mains.length) out.push(log(`${c._name(peer)} left during step ${c.step}: its micro-batches ${pyList(mains)} go to the others`));
      out.push(...c._dispatch(fresh));
    }
    for (const j of [...c.checks.keys()].sort((a, b) => a - b)) out.push(...(await c.trust.judge(j)));
    out.push(...(await c._maybeCommit()));
    return out;
  }

  async deadline() { return this.c._checkDeadlines(); }

  /** tasks: the step's tasks (their kind "main" results count); checks: micro-batch -> its
   * decided check. Returns {total, contributors (sorted [peer, micro-batches]), loss (the
   * mean over micro-batches), unchecked (peers other than `me` whose contribution in the
   * total no spot-check confirmed)}. */
  static total(tasks, checks, size, me) {
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

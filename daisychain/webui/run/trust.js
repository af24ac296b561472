// The coordinator's trust in its members (daisychain/peer/run/trust.py): spot-check verdicts
// (checks.js verdict) on the answers of the current step, strikes, the removal of a liar,
// and the rollback of the steps its unchecked contributions went into (rollback.js).
// Trust is one object that the Coordinator holds (coordinator.trust) and delegates to. It
// owns the strikes, the removed list, the rollback window and uncheckedSince; its answers
// are outputs. What a verdict or a removal does to the step under way (a referee's task, a
// liar's open work given to the others, a rollback's new term) it asks of the coordinator,
// whose book of the step (tasks, checks) it reads.

import { verdict } from "./checks.js";
import { paramsSha256 } from "../engine/trainer.js";
import { log, sameInts, send } from "./util.js";
import { alarm as alarmOutput } from "./outputs.js";

/** strikeCount (peer -> strikes), removed (the liars removed from the run, handed over),
 * window (the rollback window: the member's, one object across terms), uncheckedSince (peer
 * -> its first step with an unchecked contribution). */
export class Trust {
  constructor(coordinator, removed, window) {
    this.c = coordinator;
    this.strikeCount = new Map();
    this.removed = new Set(removed);
    this.useWindow(window);
  }

  /** Go on with `window` (a new coordinator's, a catch-up's, a restore's). */
  useWindow(window) {
    this.window = window;
    this.uncheckedSince = window.uncheckedSince();
  }

  /** Step `step`'s committed `total` (`unchecked`: the peers whose contribution in it no
   * spot-check confirmed) goes into the rollback window. */
  async record(step, total, unchecked, encoded = null) {
    await this.window.record(this.c.trainer, step, total, unchecked, encoded);
    for (const p of unchecked) if (!this.uncheckedSince.has(p)) this.uncheckedSince.set(p, step);
  }

  _openFor(j) {
    return [...this.c.tasks.values()].filter((t) => t.micro.length === 1 && t.micro[0] === j && !t.result && t.assignees.length);
  }

  /** Compare the answers for spot-checked micro-batch j, bit for bit (see run/trust.py judge). */
  async judge(j) {
    const c = this.c;
    const check = c.checks.get(j);
    if (!check || check.decided || !check.votes.size) return [];
    const votes = new Map([...check.votes].map(([p, v]) => [p, v.ints]));
    const [what, arg] = verdict(votes, c.me, this._openFor(j).length > 0, check.refereed);
    if (what === "decide") return this._decide(j, arg);
    if (what === "wait") return [];
    check.refereed = true;
    return [log(`spot-check of micro-batch ${j} of step ${c.step}: ${arg.map((p) => c._name(p)).join(" and ")} differ; the coordinator computes it`),
      ...c._dispatch([c._newTask(c.me, [j], "referee")])];
  }

  async _decide(j, by) {
    const c = this.c;
    const check = c.checks.get(j);
    check.decided = check.votes.get(by);
    check.decidedBy = by;
    const ref = check.decided.ints;
    const out = [];
    for (const peer of [...check.votes.keys()].sort()) {
      if (!sameInts(check.votes.get(peer).ints, ref)) {
        out.push(...await this.strike(peer, "mismatch", j, `spot-check mismatch: ${c._name(peer)} sent a wrong contribution for micro-batch ${j} of step ${c.step} (the reference is ${c._name(by)}'s)`));
      }
    }
    return out;
  }

  /** One strike against `peer`; at the run's `strikes` it is removed. */
  async strike(peer, alarm, micro, text) {
    const c = this.c;
    if (peer === c.me || this.removed.has(peer)) return [log(text, true)];
    const n = (this.strikeCount.get(peer) || 0) + 1;
    this.strikeCount.set(peer, n);
    const t = `${text} (strike ${n} of ${c.strikes})`;
    const out = [log(t, true), alarmOutput(alarm, peer, c.names.get(peer) ?? peer, c.step, micro, n, t)];
    if (n >= c.strikes) out.push(...(await this._remove(peer, n, t)));
    return out;
  }

  /** Remove a liar (run/trust.py _remove): it is told why and gets no more work or totals. The
   * steps in the rollback window that hold an unchecked contribution of it are undone (the
   * room goes back to the earliest and computes them again); unchecked ones older than the
   * window are reported. Without any in the window, none of its answers of this step that a
   * spot-check did not confirm is used (they are computed again). */
  async _remove(peer, n, last) {
    const c = this.c;
    this.removed.add(peer);
    c.member.removed.add(peer); // announced with every total: a new coordinator keeps it
    const name = c.names.get(peer) ?? peer;
    const text = `liar removed: ${name} (${peer}) after ${n} strikes`;
    const out = [log(text, true), alarmOutput("removed", peer, name, c.step, null, n, text)];
    if (c.open.has(peer)) {
      out.push(send(peer, { T: "refuse", term: c.term, reasons: [`${n} strikes (the last: ${last})`.slice(0, 1000)] }));
    }
    const since = this.window.earliest(peer);
    const first = this.uncheckedSince.get(peer);
    if (first !== undefined && (since === null || first < since)) {
      out.push(log(`liar ${c._name(peer)} sent unchecked contributions from step ${first} on, older than the rollback window (${this.window.size} steps, from step ${this.window.first}): they stay in the model`, true));
    }
    if (since !== null) {
      c.crew.delete(peer);
      return [...out, ...(await this._rollBack(peer, since))];
    }
    for (const check of c.checks.values()) { // a check that only its answer decided is open again
      if (check.decided && check.decidedBy === peer && check.votes.size < 2) {
        check.decided = null;
        check.decidedBy = null;
      }
    }
    for (const t of c.tasks.values()) {
      if (t.result && t.result.peer === peer) {
        const check = t.micro.length === 1 ? c.checks.get(t.micro[0]) : undefined;
        if (!check || !check.decided) { // computed again by the others (trust.py _remove: seed 87)
          t.result = null;
          t.assignees = [peer];
        }
      }
    }
    for (const check of c.checks.values()) if (!check.decided) check.votes.delete(peer);
    return [...out, ...(await c._memberLeft(peer, true, true))];
  }

  /** trust.py tell_removed: each removed liar still in the room is told again (the refuse of
   * the one that removed it may have died with it: seed 676). */
  tellRemoved() {
    const c = this.c;
    const reasons = ["removed from the run earlier (a caught liar): the new coordinator keeps it out"];
    return [...this.removed].sort().filter((p) => c.open.has(p) && c.room.has(p) && p !== c.me)
      .map((p) => send(p, { T: "refuse", term: c.term, reasons }));
  }

  /** trust.py holds_lies: a restore to a state a rollback undid (a checkpoint saved before its
   * liar was caught, seed 1338) is refused in one line; [] for any other state. */
  async holdsLies(st) {
    const liar = this.window.tainted.get(await paramsSha256(st.theta.subarray(0, this.c.trainer.layout.size)));
    if (liar === undefined) return [];
    return [log(`not restored: the checkpoint (step ${st.step}) holds steps rolled back for liar ${this.c._name(liar)}'s unchecked contributions`, true)];
  }

  /** Go back to the state before step `since` and compute again from there (a new term: the
   * coordinator reopens the room). */
  async _rollBack(peer, since) {
    const c = this.c;
    const n = c.step - since;
    await this.window.goBack(c.trainer, since, peer);
    await c._rehash();
    for (const [p, s] of [...this.uncheckedSince]) if (s >= since) this.uncheckedSince.delete(p);
    c.term += 1;
    return c._reopen([log(`rolled back ${n} step${n === 1 ? "" : "s"}: liar ${c._name(peer)} sent unchecked contributions since step ${since}`, true)]);
  }
}

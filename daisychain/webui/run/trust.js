// The trust role of the coordinator (daisychain/peer/run/trust.py): spot-check verdicts
// (checks.js verdict) on the answers of the current step, strikes, the removal of a liar,
// and the rollback of the steps its unchecked contributions went into (rollback.js).
// The methods of Coordinator (coordinator.js copies them onto its prototype: the same object,
// the coordinator's attributes; a file of its own for one idea).

import { verdict } from "./checks.js";
import { paramsSha256 } from "../engine/trainer.js";
import { log, sameInts, send } from "./util.js";

export class TrustRole {

  _openFor(j) {
    return [...this.tasks.values()].filter((t) => t.micro.length === 1 && t.micro[0] === j && !t.result && t.assignees.length);
  }

  /** Compare the answers for spot-checked micro-batch j, bit for bit (see run/trust.py _judge). */
  async _judge(j) {
    const c = this.checks.get(j);
    if (!c || c.decided || !c.votes.size) return [];
    const votes = new Map([...c.votes].map(([p, v]) => [p, v.ints]));
    const [what, arg] = verdict(votes, this.me, this._openFor(j).length > 0, c.refereed);
    if (what === "decide") return this._decide(j, arg);
    if (what === "wait") return [];
    c.refereed = true;
    return [log(`spot-check of micro-batch ${j} of step ${this.step}: ${arg.map((p) => this._name(p)).join(" and ")} differ; the coordinator computes it`),
      ...this._dispatch([this._newTask(this.me, [j], "referee")])];
  }

  async _decide(j, by) {
    const c = this.checks.get(j);
    c.decided = c.votes.get(by);
    c.decidedBy = by;
    const ref = c.decided.ints;
    const out = [];
    for (const peer of [...c.votes.keys()].sort()) {
      if (!sameInts(c.votes.get(peer).ints, ref)) {
        out.push(...await this._strike(peer, "mismatch", j, `spot-check mismatch: ${this._name(peer)} sent a wrong contribution for micro-batch ${j} of step ${this.step} (the reference is ${this._name(by)}'s)`));
      }
    }
    return out;
  }

  /** One strike against `peer`; at the run's `strikes` it is removed. */
  async _strike(peer, alarm, micro, text) {
    if (peer === this.me || this.banned.has(peer)) return [log(text, true)];
    const n = (this.strikeCount.get(peer) || 0) + 1;
    this.strikeCount.set(peer, n);
    const t = `${text} (strike ${n} of ${this.strikes})`;
    const out = [log(t, true), { kind: "alarm", alarm, peer, name: this.names.get(peer) ?? peer, step: this.step, micro, strikes: n, text: t }];
    if (n >= this.strikes) out.push(...(await this._remove(peer, n, t)));
    return out;
  }

  /** Remove a liar (run/trust.py _remove): it is told why and gets no more work or totals. The
   * steps in the rollback window that hold an unchecked contribution of it are undone (the
   * room goes back to the earliest and computes them again); unchecked ones older than the
   * window are reported. Without any in the window, none of its answers of this step that a
   * spot-check did not confirm is used (they are computed again). */
  async _remove(peer, n, last) {
    this.banned.add(peer);
    this.member.removed.add(peer); // announced with every total: a new coordinator keeps it
    const name = this.names.get(peer) ?? peer;
    const text = `liar removed: ${name} (${peer}) after ${n} strikes`;
    const out = [log(text, true), { kind: "alarm", alarm: "removed", peer, name, step: this.step, micro: null, strikes: n, text }];
    if (this.open.has(peer)) {
      out.push(send(peer, { T: "refuse", term: this.term, reasons: [`${n} strikes (the last: ${last})`.slice(0, 1000)] }));
    }
    const since = this.window.earliest(peer);
    const first = this.uncheckedSince.get(peer);
    if (first !== undefined && (since === null || first < since)) {
      out.push(log(`liar ${this._name(peer)} sent unchecked contributions from step ${first} on, older than the rollback window (${this.window.size} steps, from step ${this.window.first}): they stay in the model`, true));
    }
    if (since !== null) {
      this.crew.delete(peer);
      return [...out, ...(await this._rollBack(peer, since))];
    }
    for (const c of this.checks.values()) { // a check that only its answer decided is open again
      if (c.decided && c.decidedBy === peer && c.votes.size < 2) {
        c.decided = null;
        c.decidedBy = null;
      }
    }
    for (const t of this.tasks.values()) {
      if (t.result && t.result.peer === peer) {
        const c = t.micro.length === 1 ? this.checks.get(t.micro[0]) : undefined;
        if (!c || !c.decided) t.result = null;
      }
    }
    for (const c of this.checks.values()) if (!c.decided) c.votes.delete(peer);
    return [...out, ...(await this._memberLeft(peer, true, true))];
  }

  /** trust.py _tell_removed: each removed liar still in the room is told again (the refuse of
   * the one that removed it may have died with it: seed 676). */
  _tellRemoved() {
    const reasons = ["removed from the run earlier (a caught liar): the new coordinator keeps it out"];
    return [...this.banned].sort().filter((p) => this.open.has(p) && this.room.has(p) && p !== this.me)
      .map((p) => send(p, { T: "refuse", term: this.term, reasons }));
  }

  /** trust.py _holds_lies: a restore to a state a rollback undid (a checkpoint saved before its
   * liar was caught, seed 1338) is refused in one line; [] for any other state. */
  async _holdsLies(st) {
    const liar = this.window.tainted.get(await paramsSha256(st.theta.subarray(0, this.trainer.layout.size)));
    if (liar === undefined) return [];
    return [log(`not restored: the checkpoint (step ${st.step}) holds steps rolled back for liar ${this._name(liar)}'s unchecked contributions`, true)];
  }

  /** Go back to the state before step `since` and compute again from there. */
  async _rollBack(peer, since) {
    const n = this.step - since;
    await this.window.goBack(this.trainer, since, peer);
    await this._rehash();
    for (const [p, s] of [...this.uncheckedSince]) if (s >= since) this.uncheckedSince.delete(p);
    this.term += 1;
    return this._reopen([log(`rolled back ${n} step${n === 1 ? "" : "s"}: liar ${this._name(peer)} sent unchecked contributions since step ${since}`, true)]);
  }
}

// The catch-up role of the coordinator (daisychain/peer/run/catchup.py): bringing the replicas
// to one state. A member that says it holds a later step is asked for its STATE only once a
// second member reports the same step and hash, and that STATE is taken only from the member
// asked, at that step and hash (one nobody asked for is refused, a strike); with no
// confirmation the room goes on from the coordinator's state. A member that fell behind or
// diverged asks (`sync`) and gets the state once per term and step. A restore (from a
// checkpoint) or a rollback reopens the run on the coordinator's state in a new term. The methods of Coordinator
// (coordinator.js copies them onto its prototype: the same object, the coordinator's
// attributes; a file of its own for one idea).

import { paramsSha256 } from "../engine/trainer.js";
import { checkedState } from "./state.js";
import { log, send, setting } from "./util.js";
import { restored } from "./outputs.js";

/** How long a coordinator waits for the STATE of a member that said it is ahead (and for a
 * second member to confirm that step); as catchup.py. */
export const SYNC_WAIT_S = 20.0;
/** How long a restore (or a rollback) waits for the members to answer its new term; as catchup.py. */
export const RESTORE_WAIT_S = 20.0;

export class CatchUpRole {
  /** coordinator.py on_state: the STATE of a member that was ahead, asked for and confirmed by
   * another member's report: take it and restart from there. A STATE nobody asked for is
   * refused, and its sender struck. */
  async onState(sender, msg) {
    if (!this.trainer) return [];
    if (!this.askedState.has(sender)) {
      return this._refusedFrom(sender, `refused a state (step ${msg.step}) from ${this._name(sender)}: nobody asked for it`);
    }
    if (!this.catchingUp || sender !== this.catchFrom) {
      return [log(`a state from ${this._name(sender)} (step ${msg.step}) after the room went on without it: ignored`, true)];
    }
    const [rs, rh] = this.catchReport;
    if (msg.step !== rs || msg.params_sha256 !== rh) {
      return this._refusedFrom(sender, `refused a state from ${this._name(sender)}: step ${msg.step}, params ${msg.params_sha256.slice(0, 12)} is not the step ${rs}, params ${rh.slice(0, 12)} it reported`);
    }
    if ((await paramsSha256(msg.theta)) !== msg.params_sha256) {
      return [log(`state from ${sender} does not match its hash: ignored`, true)];
    }
    if (msg.step <= this.step) return [];
    let st;
    try {
      st = await checkedState(this.trainer, msg);
    } catch (err) {
      return [log(`state from ${sender}: ${err.message}: ignored`, true)];
    }
    await this.member.load(st);
    this.pending.clear();
    return [log(`synced to step ${msg.step} from ${sender} (params ${msg.params_sha256.slice(0, 12)})`), ...(await this._caughtUp())];
  }

  /** coordinator.py _refused_from: `text` refuses what `sender` sent, a strike if it is a
   * member of the run. */
  _refusedFrom(sender, text) {
    if (this.crew.has(sender) && !this.banned.has(sender)) return this.trust.strike(sender, "refused", null, text);
    return [log(text, true)];
  }

  /** coordinator.py _ahead: `sender` reported a later step than ours. Its state is asked for
   * once another member reports the same step and hash; with nobody left to confirm it, or
   * none within SYNC_WAIT_S, the room goes on from ours and `sender` is brought to it. */
  async _ahead(sender) {
    const m = this.crew.get(sender);
    const [step, sha] = m.ahead;
    const same = [...this.crew.values()].filter((o) => o.ahead && o.ahead[0] === step && o.ahead[1] === sha
      && o.id !== sender && !this.banned.has(o.id) && !o.refused).map((o) => o.id).sort();
    if (same.length && !this.catchingUp) {
      this.catchingUp = true;
      this.catchFrom = sender;
      this.catchReport = m.ahead;
      this.catchUntil = this.now + SYNC_WAIT_S;
      this.askedState.add(sender);
      return [log(`${sender} is ahead (step ${step}, as ${same.join(", ")} reports too): taking its state`),
        send(sender, { T: "sync", term: this.term, step: this.step, params_sha256: this.sha, reason: "coordinator behind" })];
    }
    if (same.length) return [];
    const could = [...this.room].filter((p) => p !== this.me && p !== sender && !this.banned.has(p)
      && !(this.crew.has(p) && this.crew.get(p).refused));
    if (!could.length) return this._unconfirmed(sender);
    return [log(`${sender} says it is ahead (step ${step}, params ${sha.slice(0, 12)}); no other member reports it yet: waiting up to ${SYNC_WAIT_S} s for one`)];
  }

  /** coordinator.py _unconfirmed: nobody confirmed `sender`'s later step: go on from ours and
   * bring it to it. */
  async _unconfirmed(sender) {
    const m = this.crew.get(sender);
    const step = m.ahead[0];
    m.ahead = null;
    m.synced = true;
    return [log(`no other member confirms step ${step} of ${this._name(sender)}: going on from step ${this.step} and sending it the state`, true),
      send(sender, await this._state()), ...this._maybeBegin()];
  }

  /** A member that said it is ahead sent no usable STATE in SYNC_WAIT_S (it never answered,
   * or its state was refused), or nobody confirmed its step in that time: go on from ours and
   * bring it to it (as daisychain/peer/run/). */
  async _checkCatchUp() {
    const out = [];
    for (const p of [...this.crew.keys()].sort()) {
      const m = this.crew.get(p);
      if (m.ahead && this.now >= m.aheadUntil && !this.banned.has(p) && !m.refused
          && !(this.catchingUp && p === this.catchFrom)) out.push(...(await this._unconfirmed(p)));
    }
    if (!this.catchingUp || this.now < this.catchUntil) return out;
    this.catchingUp = false;
    const peer = this.catchFrom;
    const m = this.crew.get(peer);
    out.push(log(`${this._name(peer)} sent no state in ${SYNC_WAIT_S} s: going on from step ${this.step}`, true));
    if (m) m.ahead = null;
    if (m && m.ready && !m.refused && !this.banned.has(peer)) {
      m.synced = true;
      out.push(send(peer, await this._state()));
    }
    return out;
  }

  /** The coordinator took the state of a member that was ahead: restart from there. */
  async _caughtUp() {
    this.catchingUp = false;
    this.tasks.clear();
    this.checks.clear();
    this.stepStarted = false;
    this.aggregation.drop();
    await this._newWindow();
    for (const m of this.crew.values()) { m.synced = false; m.ahead = null; }
    return this._announceTargets().map((p) => send(p, this._announce()));
  }

  /** coordinator.py on_syncrequest: answered once per member, term and step, and only when it
   * can be true (a member of the run, this term, not already on our step and hash); anything
   * else costs nothing. */
  async onSync(sender, msg) {
    const m = this.crew.get(sender);
    if (!this.trainer || !m || this.banned.has(sender) || msg.term !== this.term) return [];
    if (msg.step === this.step && msg.params_sha256 === this.sha) return [];
    const key = `${this.term}:${this.step}`;
    if (m.answered === key) return [];
    m.answered = key;
    const out = [];
    if (msg.reason !== "coordinator behind") {
      out.push(log(`${sender} diverged at step ${msg.step} (params ${msg.params_sha256.slice(0, 12)}, ${msg.reason}): resyncing it`, true));
    }
    return [...out, send(sender, await this._state()), ...this.aggregation.resend(sender)];
  }

  /** Restore the whole room from a checked state {step, theta, m, v, b1t, b2t, params_sha256}
   * (coordinator.py restore): a new term, each member gets restore + STATE + run; training
   * continues from `step` (to `steps`, if given). Throws when the state does not fit the run. */
  async restore(st, steps = null) {
    const checked = await checkedState(this.trainer, st, st.params_sha256 || null);
    const refused = await this.trust.holdsLies(st);
    if (refused.length) return refused;
    const sha = await this.member.load(checked);
    const settings = [];
    if (steps !== null) {
      this.steps = steps;
      settings.push(setting("steps", steps));
    }
    await this._newWindow();
    this.term += 1;
    return [...settings, ...await this._reopen([log(`restored the room from a checkpoint: step ${st.step}, params ${sha.slice(0, 12)} (term ${this.term})`),
      restored(st.step, sha, this.me)])];
  }

  /** A new term (already counted) on a state the coordinator loaded (a restore, a rollback):
   * open work is dropped; each member gets restore + STATE + run. */
  async _reopen(out) {
    this.restoredTerm = this.term;
    this.tasks = new Map();
    this.checks = new Map();
    this.stepStarted = false;
    this.catchingUp = false;
    this.ended = false;
    this.pending.clear();
    this.aggregation.drop();
    for (const m of this.crew.values()) {
      m.ready = false;
      m.synced = false;
    }
    const targets = this._announceTargets();
    this.waitFor = new Set(targets);
    this.waitUntil = this.now + RESTORE_WAIT_S;
    const state = await this._state();
    const announce = this._announce();
    for (const p of targets) { // a member that never joined gets the state when it answers `run`
      const m = this.crew.get(p);
      if (m && !m.refused) out.push(send(p, { T: "restore", term: this.term, step: this.step, params_sha256: state.params_sha256 }), send(p, state));
      out.push(send(p, announce));
    }
    return [...out, ...this._maybeBegin()];
  }
}

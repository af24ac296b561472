// The member role (daisychain/peer/run/member.py): follow the coordinator that announced the run,
// compute the tasks it assigns, apply each step's total and compare hashes, take a STATE
// when behind or restored, and leave when removed. Mixed into RunPeer (driver.js).

import { paramsSha256, runIdentity } from "../engine/trainer.js";
import { checkedState, loadState, tensorBounds } from "./state.js";
import { log, send } from "./util.js";

const IDENTITY_NAMES = { model: "model spec", hyper: "hyperparameters", dataset: "dataset fingerprint",
  luts: "LUT manifest", engine: "engine version", seed: "seed", task: "task" };

function deepEqual(a, b) {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  if (ka.length !== kb.length) return false;
  return ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && deepEqual(a[k], b[k]));
}

/** trainer.py identity_differences: what differs, in words. */
export function identityDifferences(mine, theirs) {
  const out = [];
  for (const [k, label] of Object.entries(IDENTITY_NAMES)) {
    const a = mine[k];
    const b = theirs[k];
    if (deepEqual(a, b)) continue;
    if ((a && typeof a === "object") || (b && typeof b === "object")) out.push(`${label} differs`);
    else out.push(`${label}: ${a} here, ${b} in the run`);
  }
  return out;
}

export class MemberRole {
  async _onRun(sender, msg) {
    // A higher term from anyone (a new host's announce can overtake the server's room
    // message that names it), the current term only from the coordinator we follow.
    if (this.refused || this.coordinating || msg.term < this.term
        || (msg.term === this.term && sender !== this.coord)) return [];
    this.coord = sender;
    this.steps = msg.steps;
    this.verifyRate = msg.verify_rate ?? 0.0;
    this.strikes = msg.strikes ?? STRIKES;
    const first = !this.run || msg.run_id !== this.run.run_id;
    if (first || msg.term !== this.term) {
      this.pending.clear(); // (the same announce again, on a reopened channel: work goes on)
      this._ringDrop(); // ring hook
    }
    this.term = msg.term;
    this.run = msg;
    this.ended = false;
    if (this.trainer && !first) return [send(sender, this._ready())];
    if (this.trainer && first) { // another run (ours ended): start over from its data
      this.trainer = null;
      this.bounds = null;
    }
    this.awaitingData = true;
    return [{ kind: "fetch", task: String(msg.identity.task || ""), fingerprint: String(msg.identity.dataset || "") }];
  }

  async _prepared(ds) {
    try {
      this.trainer = await this.makeTrainer(this.run.identity, ds);
    } catch (err) {
      return this._refuse([`cannot build the run here: ${err.message}`]);
    }
    this.identity = runIdentity(this.trainer.spec, this.trainer.hp, ds, this.trainer.luts);
    this.bounds = tensorBounds(this.trainer);
    await this._rehash();
    return this._checkIdentity();
  }

  _checkIdentity() {
    const reasons = identityDifferences(this.identity, this.run.identity);
    if (!this.selftest[0]) reasons.push(`self-test failed: ${this.selftest[1]}`);
    if (reasons.length) return this._refuse(reasons);
    return [log(`joined run ${this.run.run_id} (step ${this.run.step} of ${this.run.steps})`),
      { kind: "joined" }, send(this.coord, this._ready())];
  }

  _ready() {
    return { T: "ready", term: this.term, capacity: Number(this.capacity || 1.0), kind: this.kind,
      step: this.step, params_sha256: this.sha };
  }

  _refuse(reasons) {
    this.refused = true;
    const out = [{ kind: "refused", peer: this.me, reasons }];
    if (this.coord && this.coord !== this.me) out.unshift(send(this.coord, { T: "refuse", term: this.term, reasons }));
    return out;
  }

  async _onAssign(sender, msg) {
    if (this.coordinating || sender !== this.coord || msg.term !== this.term || !this.trainer) return [];
    if (msg.step !== this.step) return [];
    const out = [];
    for (const t of msg.tasks) {
      const key = `${msg.step}:${t.task}`;
      if (t.peer === this.me && !this.pending.has(key)) {
        this.pending.set(key, t.micro);
        out.push({ kind: "compute", step: msg.step, task: t.task, micro: t.micro, theta: this.trainer.theta.slice() });
      }
    }
    return out;
  }

  async _onTotal(sender, msg) {
    if (this.coordinating || sender !== this.coord || !this.trainer) return [];
    if (msg.step < this.step) return [];
    if (msg.step > this.step) {
      return [log(`missed steps ${this.step}..${msg.step - 1}: resyncing`, true),
        send(sender, { T: "sync", term: this.term, step: this.step, params_sha256: this.sha, reason: "behind" })];
    }
    const out = await this._apply(msg.ints, msg.loss, msg.contributors, msg.params_sha256, sender);
    if (msg.tasks?.length && msg.term === this.term && this.sha === msg.params_sha256) {
      // the next step's tasks, started the moment the total is applied (not on a replica
      // that just diverged: it waits for its STATE; a backup takes the task)
      out.push(...(await this._onAssign(sender, { T: "assign", term: msg.term, step: msg.step + 1, tasks: msg.tasks })));
    }
    return out;
  }

  async _onState(sender, msg) {
    if (!this.trainer || (sender !== this.coord && !this.coordinating)) return [];
    const restore = this.coordinating ? null : this.restoring;
    this.restoring = null;
    if ((await paramsSha256(msg.theta)) !== msg.params_sha256) {
      return [log(`state from ${sender} does not match its hash: ignored`, true)];
    }
    if (restore && (restore.step !== msg.step || restore.sha !== msg.params_sha256)) {
      return [log(`restore from ${sender}: the state (step ${msg.step}, params ${msg.params_sha256.slice(0, 12)}) is not the announced checkpoint (step ${restore.step}, params ${restore.sha.slice(0, 12)}): ignored`, true)];
    }
    if (this.coordinating && msg.step <= this.step) return [];
    let st;
    try {
      st = await checkedState(this.trainer, msg);
    } catch (err) {
      return [log(`state from ${sender}: ${err.message}: ignored`, true)];
    }
    await loadState(this.trainer, st);
    this.pending.clear();
    await this._rehash();
    const out = [log(`synced to step ${msg.step} from ${sender} (params ${msg.params_sha256.slice(0, 12)})`)];
    if (restore) out.push({ kind: "restored", step: msg.step, params_sha256: msg.params_sha256, by: sender });
    if (this.coordinating) return [...out, ...(await this._caughtUp())]; // caught up with a member that was ahead
    return [...out, ...(await this._ringSynced())]; // ring hook: a held ring plan of this step starts
  }

  /** The coordinator restored the room: the STATE that follows replaces ours. */
  async _onRestore(sender, msg) {
    if (this.refused || this.coordinating || !this.trainer || msg.term < this.term) return [];
    if (sender !== this.coord && sender !== this.host) {
      return [log(`a restore from ${sender}, who does not coordinate the run: ignored`, true)];
    }
    this.coord = sender;
    this.term = msg.term;
    this.restoring = { step: msg.step, sha: msg.params_sha256 };
    this.pending.clear();
    this.ended = false;
    return [log(`${sender} restores the room from a checkpoint: step ${msg.step}, params ${msg.params_sha256.slice(0, 12)}`)];
  }

  async _onEnd(sender, msg) {
    if (sender !== this.coord || !this.trainer || this.ended) return [];
    if (this._ringHoldsEnd(msg)) return []; // ring hook: our ring's last total is still gathering
    this.ended = true;
    return [{ kind: "ended", step: msg.step, params_sha256: this.sha,
      agreed: this.sha === msg.params_sha256 && msg.step === this.step }];
  }

  async _onData(sender, msg) {
    if (sender !== this.coord || !this.awaitingData) return [];
    return [{ kind: "dataBytes", data: msg.data }];
  }

  _committed(step, loss, contributors, sha) {
    for (const [peer, n] of contributors) this.doneBy[peer] = (this.doneBy[peer] || 0) + n;
    const mine = contributors.find(([p]) => p === this.me)?.[1] || 0;
    return [{ kind: "committed", step, loss, contributors, mine, params_sha256: sha }];
  }

  async _apply(ints, loss, contributors, sha, sender) {
    const step = this.step;
    await this.trainer.apply(ints);
    for (const k of [...this.pending.keys()]) if (Number(k.split(":")[0]) <= step) this.pending.delete(k);
    const out = this._committed(step, loss, contributors, sha);
    const mine = await this._rehash();
    if (mine !== sha) {
      out.push(log(`PARAMETER HASH MISMATCH after step ${step}: ${mine.slice(0, 16)} here, ${sha.slice(0, 16)} at the coordinator: resyncing`, true));
      out.push(send(sender, { T: "sync", term: this.term, step: this.step, params_sha256: mine, reason: "hash mismatch" }));
    }
    return out;
  }

  /** The coordinator removed this replica from the run (`reasons`: why). */
  async _memberOnRefuse(sender, msg) {
    if (sender !== this.coord || this.refused) return [];
    this.refused = true;
    this.ended = true;
    this.pending.clear();
    const reason = msg.reasons.join("; ");
    return [log(`removed from the run by ${this._name(sender)}: ${reason}`, true), { kind: "removed", by: sender, reason }];
  }
}

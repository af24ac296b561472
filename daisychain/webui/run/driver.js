// The thin driver (daisychain/peer/run/driver.py): one replica's view of a run, as a plain object:
// no sockets, no timers, no DOM. It holds what every role shares (the trainer, the room, the
// term) and routes each input to its role: MemberRole (member.js), CoordinatorRole
// (coordinator.js), TrustRole (trust.js). A port of daisychain/peer/run/, rule for rule, so that a tab and daisy-peers follow the
// same run protocol (docs/MESH.md). The shell (mesh.js) feeds it
//   members(ids, host), channelOpen(id), channelClosed(id), receive(sender, msg),
//   computed(step, task, result), data(dataset|null), tick(now)
// and performs what they return (arrays of outputs):
//   {kind: "send", to, message}   {kind: "compute", step, task, micro, theta}
//   {kind: "fetch", task, fingerprint}   {kind: "committed", step, loss, contributors, mine, params_sha256}
//   {kind: "refused", peer, reasons}     {kind: "log", text, loud}
//   {kind: "ended", step, params_sha256, agreed}   {kind: "removed", by, reason}   {kind: "joined"}
//   {kind: "restored", step, params_sha256, by}
//   {kind: "alarm", alarm: mismatch|refused|removed, peer, name, step, micro, strikes, text}
// Messages are plain objects with `T` = run | ready | refuse | assign | sync | data_request |
// restore | end | contrib | total | state | data and the fields of frames.py's dataclasses.
// tests/test_scenarios.py plays the same scenario files (tests/scenarios/*.json) against this
// and daisychain/peer/run/ and asserts the same outputs, message for message.
//
// Hashes are async in the browser (crypto.subtle), so every entry point is async; the shell
// calls them one at a time.

import { paramsSha256 } from "../engine/trainer.js";
import { CoordinatorRole } from "./coordinator.js";
import { MemberRole } from "./member.js";
import { RingRole } from "./ring.js";
import { Window } from "./rollback.js";
import { log, send } from "./util.js";
import { TrustRole } from "./trust.js";

/** Default share of micro-batches spot-checked by a second peer, and mismatches tolerated. */
export const VERIFY_RATE = 0.05;
export const STRIKES = 3;
export const MAX_STRIKES = 1000;

function randomKey() {
  const b = new Uint8Array(16);
  globalThis.crypto.getRandomValues(b);
  return [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
}

export class RunPeer {
  constructor(me, { kind = "cpu", capacity = null, makeTrainer = null, selftest = [true, "ok"],
    verifyRate = VERIFY_RATE, strikes = STRIKES, verifyKey = null, waitPeers = 0, window = null, aggregate = "star" } = {}) {
    if (!(Number.isFinite(verifyRate) && verifyRate >= 0 && verifyRate <= 1)) throw new RangeError("the verify rate must be in [0, 1]");
    if (!(Number.isInteger(strikes) && strikes >= 1 && strikes <= MAX_STRIKES)) throw new RangeError(`strikes must be in [1, ${MAX_STRIKES}]`);
    this.me = me;
    this.kind = kind;
    this.capacity = capacity;
    this.makeTrainer = makeTrainer; // async (identity, dataset) -> Trainer
    this.selftest = selftest;
    this.verifyRate = verifyRate;
    this.strikes = strikes;
    this.verifyKey = verifyKey || randomKey();
    this.windowSize = window; // the rollback window in steps (null: from the verify rate)
    this.waitPeers = waitPeers;
    this.names = new Map();    // signaling id -> the name it gave (for logs)
    this.checks = new Map();   // coordinator: spot-checks of the current step
    this.strikeCount = new Map();
    this.banned = new Set();   // coordinator: removed from the run (liars)
    this.trainer = null;
    this.bounds = null;
    this.identity = null; // this replica's own identity of the run it holds
    this.sha = null;      // cached params hash of this.trainer
    this.steps = 0;
    this.now = 0;
    this.selfSpm = null;  // the coordinator's own seconds per micro-batch
    this.timingFrom = 0;  // ... timed from this step on (see _timeTask)
    this.host = null;     // the room host per the signaling server
    this.coord = null;    // the coordinator whose run announce we follow
    this.open = new Set();
    this.room = new Set();
    this.term = 0;
    this.run = null;
    this.coordinating = false;
    this.crew = new Map();
    this.tasks = new Map();
    this.nextTask = 0;
    this.stepStarted = false;
    this.ended = false;
    this.refused = false;
    this.pending = new Map(); // "step:task" -> micro
    this.doneBy = {};
    this.awaitingData = false;
    this.catchingUp = false;
    this.catchFrom = null;   // coordinator: the member ahead whose state we asked for
    this.catchUntil = 0;
    this.restoring = null;   // member: {step, sha} a restore announced, until its STATE
    this.restoredTerm = -1;  // coordinator: this term's state came from a restore
    this.waitFor = new Set(); // coordinator: members to hear from before a step
    this.waitUntil = 0;
    this.window = new Window(0);       // coordinator: the rollback window (rollback.js)
    this.uncheckedSince = new Map();   // coordinator: peer -> first step with an unchecked contribution
    this._ringInit(aggregate);         // ring hook: auto | star | ring (ring.js)
  }

  get step() { return this.trainer ? this.trainer.step : 0; }

  get runId() { return this.run ? this.run.run_id : ""; }

  async _rehash() {
    this.sha = await paramsSha256(this.trainer.theta);
    return this.sha;
  }

  _announce() {
    return { T: "run", identity: this.identity, run_id: this.run.run_id, steps: this.steps,
      term: this.term, step: this.step, params_sha256: this.sha, coordinator: this.me,
      verify_rate: this.verifyRate, strikes: this.strikes };
  }

  _name(peer) {
    const name = this.names.get(peer);
    return name && name !== peer ? `${name} (${peer})` : peer;
  }

  // -- inputs --------------------------------------------------------------------------------

  async tick(now) {
    this.now = now;
    if (!this.coordinating || this.ended) return [];
    return [...(await this._checkCatchUp()), ...(await this._checkDeadlines()), ...this._ringCheckDeadline(), // ring hook
      ...this._maybeBegin()];
  }

  /** The signaling room changed: approved online members `ids` (self included); `names`:
   * id -> the name each gave the server (used in logs). */
  async setMembers(ids, host, names = null) {
    const out = [];
    this.room = new Set(ids);
    if (names) for (const [k, v] of Object.entries(names)) this.names.set(String(k), String(v).slice(0, 64));
    const gone = [...this.crew.keys()].filter((m) => !this.room.has(m));
    this.host = host;
    if (host === this.me && !this.coordinating && this.trainer && this.run) {
      out.push(...(await this._becomeCoordinator()));
    } else if (host !== this.me && this.coordinating) {
      this.coordinating = false; // another host was named (we were away): follow it
      out.push(log(`${host} is the coordinator now`));
    }
    for (const m of gone) out.push(...(await this._memberLeft(m)));
    return [...out, ...this._ringStuck()]; // ring hook
  }

  async channelOpen(peer) {
    this.open.add(peer);
    if (this.coordinating && this.run && !this.ended) return [send(peer, this._announce())];
    return [];
  }

  async channelClosed(peer) {
    this.open.delete(peer);
    return this.coordinating ? this._memberLeft(peer) : this._ringStuck(); // ring hook
  }

  /** A decoded message; `runId` is its frame header's. Messages of another run than the one
   * this peer follows are dropped (loudly); only a peer whose run ended takes a `run`
   * announce of a new one (as daisychain/peer/run/). */
  async receive(sender, msg, runId = "") {
    if (runId && this.runId && runId !== this.runId && !(msg.T === "run" && this.ended && !this.coordinating)) {
      return [log(`a ${msg.T} message of run ${runId} from ${this._name(sender)}; this peer follows run ${this.runId}: dropped`, true)];
    }
    const handler = {
      run: this._onRun, ready: this._onReady, refuse: this.coordinating ? this._onRefuse : this._memberOnRefuse, assign: this._onAssign,
      sync: this._onSync, data_request: this._onDataRequest, end: this._onEnd, restore: this._onRestore,
      contrib: this._onContrib, total: this._onTotal, state: this._onState, data: this._onData,
      ring_plan: this._onRingPlan, ring_sum: this._onRingSum, ring_commit: this._onRingCommit, ring_chunk: this._onRingChunk, // ring hook
    }[msg.T];
    if (!handler) return [log(`ignored a ${msg.T} message from ${sender}`)];
    return handler.call(this, sender, msg);
  }

  /** `sender` sent bytes that are not a valid message (`reason`). Logged by name; the
   * coordinator counts it as a strike against a member of the run. */
  async badMessage(sender, reason) {
    const text = `refused a message from ${this._name(sender)}: ${reason}`;
    if (this.coordinating && this.crew.has(sender) && !this.banned.has(sender)) return this._strike(sender, "refused", null, text);
    return [log(text, true)];
  }

  async computed(step, task, result) {
    const key = `${step}:${task}`;
    const micro = this.pending.get(key);
    if (micro === undefined || this.ended) return [];
    this.pending.delete(key);
    let loss = 0;
    for (const l of result.loss) loss += l;
    let correct = 0;
    for (const c of result.correct) correct += c;
    if (this._ringOwns(step, task)) return this._ringComputed(step, task, result.grad, loss, correct); // ring hook
    if (this.coordinating) return this._takeContrib(this.me, step, task, micro, result.grad, loss, correct);
    if (this.coord === null || step !== this.step) return [];
    return [send(this.coord, { T: "contrib", term: this.term, step, task, micro, loss, correct, ints: result.grad })];
  }

  /** The dataset fetch finished: a parsed dataset with its fingerprint, or null. */
  async data(ds) {
    if (!this.awaitingData || !this.run) return [];
    const want = this.run.identity.dataset;
    if (ds && ds.fingerprint === want) {
      this.awaitingData = false;
      return this._prepared(ds);
    }
    if (this.coord && this.coord !== this.me) {
      return [log("the server has no matching dataset; asking the coordinator"),
        send(this.coord, { T: "data_request", fingerprint: want })];
    }
    return this._refuse(["dataset fingerprint: no copy of the run's dataset found"]);
  }

}

for (const role of [MemberRole, CoordinatorRole, TrustRole, RingRole]) {
  for (const name of Object.getOwnPropertyNames(role.prototype)) {
    if (name !== "constructor") RunPeer.prototype[name] = role.prototype[name];
  }
}

// One replica's view of a run, as a plain object: no sockets, no timers, no DOM. A port of
// daisychain/peer/run.py (RunPeer), rule for rule, so that a tab and daisy-peers follow the
// same run protocol (docs/MESH.md). The shell (mesh.js) feeds it
//   members(ids, host), channelOpen(id), channelClosed(id), receive(sender, msg),
//   computed(step, task, result), data(dataset|null), tick(now)
// and performs what they return (arrays of outputs):
//   {kind: "send", to, message}   {kind: "compute", step, task, micro, theta}
//   {kind: "fetch", task, fingerprint}   {kind: "committed", step, loss, contributors, mine, params_sha256}
//   {kind: "refused", peer, reasons}     {kind: "log", text, loud}
//   {kind: "ended", step, params_sha256, agreed}   {kind: "failed", reason}   {kind: "joined"}
//   {kind: "restored", step, params_sha256, by}
//   {kind: "alarm", alarm: mismatch|refused|removed, peer, name, step, micro, strikes, text}
// Messages are plain objects with `T` = run | ready | refuse | assign | sync | data_request |
// restore | end | contrib | total | state | data and the fields of frames.py's dataclasses.
// tests/test_scenarios.py plays the same scenario files (tests/scenarios/*.json) against this
// and run.py and asserts the same outputs, message for message.
//
// Hashes are async in the browser (crypto.subtle), so every entry point is async; the shell
// calls them one at a time.

import { paramsSha256, runIdentity } from "./engine/trainer.js";
import { sha256Bytes } from "./sha256.js";

export const MIN_DEADLINE_S = 2.0;
export const DEADLINE_FACTOR = 4.0;
/** How long a host waits, at the start, for the members it announced the run to. */
export const START_WAIT_S = 20.0;
/** After a restore, how long the coordinator waits for the members to load the state. */
export const RESTORE_WAIT_S = 20.0;
/** How long a coordinator waits for the STATE of a member that said it is ahead (as run.py). */
export const SYNC_WAIT_S = 20.0;
/** Default share of micro-batches spot-checked by a second peer, and mismatches tolerated. */
export const VERIFY_RATE = 0.05;
export const STRIKES = 3;
export const MAX_STRIKES = 1000;

/**
 * run.py checked_micro: micro-batch j of `step` is spot-checked when the first 8 bytes of
 * SHA-256(`key:step:j`), as a big-endian u64, are below floor(rate * 2^64).
 */
export function checkedMicro(key, step, nMicro, rate) {
  const bound = BigInt(Math.floor(rate * 2 ** 64));
  const enc = new TextEncoder();
  const out = [];
  for (let j = 0; j < nMicro; j++) {
    const h = sha256Bytes(enc.encode(`${key}:${step}:${j}`));
    let v = 0n;
    for (let i = 0; i < 8; i++) v = (v << 8n) | BigInt(h[i]);
    if (v < bound) out.push(j);
  }
  return out;
}

/** Python's format(x, ".3g"), for log lines that read the same in both languages. */
export function g3(x) {
  if (x === 0) return "0";
  const exp = Math.floor(Math.log10(Math.abs(Number(x.toPrecision(3)))));
  if (exp < -4 || exp >= 3) {
    const [m, e] = x.toExponential(2).split("e");
    const mm = m.includes(".") ? m.replace(/0+$/, "").replace(/\.$/, "") : m;
    const n = Number(e);
    return `${mm}e${n < 0 ? "-" : "+"}${String(Math.abs(n)).padStart(2, "0")}`;
  }
  const t = x.toFixed(Math.max(0, 2 - exp));
  return t.includes(".") ? t.replace(/0+$/, "").replace(/\.$/, "") : t;
}

/** Python's repr of a list of ints. */
const pyList = (a) => `[${a.join(", ")}]`;
const sameInts = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

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

/** run.py finish_shares: micro-batch shares (summing to ~n) with which every peer finishes
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

/** Segment bounds of the flat vector: one segment per canonical tensor. */
export function tensorBounds(trainer) {
  const out = [0];
  let off = 0;
  for (const [, shape] of trainer.spec.paramShapes()) {
    off += shape.reduce((a, b) => a * b, 1);
    out.push(off);
  }
  return out;
}

const send = (to, message) => ({ kind: "send", to, message });
const log = (text, loud = false) => ({ kind: "log", text, loud });

class Member {
  constructor(id) {
    this.id = id;
    this.capacity = 1.0;
    this.kind = "python";
    this.ready = false;    // sent ready for this term
    this.synced = false;   // its replica is at the coordinator's step (or will be by order)
    this.refused = false;
    this.secPerMicro = 1.0;
    this.linkS = 0.0;      // seconds its link adds to a step (estimate, see _timeTask)
    this.timed = 0;        // shares of it timed (the first is left out: warm-up)
  }
}

function randomKey() {
  const b = new Uint8Array(16);
  globalThis.crypto.getRandomValues(b);
  return [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
}

export class RunPeer {
  constructor(me, { kind = "cpu", capacity = null, makeTrainer = null, selftest = [true, "ok"],
    verifyRate = VERIFY_RATE, strikes = STRIKES, verifyKey = null, waitPeers = 0 } = {}) {
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
    return [...this._checkCatchUp(), ...(await this._checkDeadlines()), ...this._maybeBegin()];
  }

  /** A member that said it is ahead sent no usable STATE in SYNC_WAIT_S (it never answered,
   * or its state was refused): go on from ours and bring it to it (as run.py). */
  _checkCatchUp() {
    if (!this.catchingUp || this.now < this.catchUntil) return [];
    this.catchingUp = false;
    const peer = this.catchFrom;
    const m = this.crew.get(peer);
    const out = [log(`${this._name(peer)} sent no state in ${SYNC_WAIT_S} s: going on from step ${this.step}`, true)];
    if (m && m.ready && !m.refused && !this.banned.has(peer)) {
      m.synced = true;
      out.push(send(peer, this._state()));
    }
    return out;
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
      out.push(...this._becomeCoordinator());
    } else if (host !== this.me && this.coordinating) {
      this.coordinating = false; // another host was named (we were away): follow it
      out.push(log(`${host} is the coordinator now`));
    }
    for (const m of gone) out.push(...(await this._memberLeft(m)));
    return out;
  }

  async channelOpen(peer) {
    this.open.add(peer);
    if (this.coordinating && this.run && !this.ended) return [send(peer, this._announce())];
    return [];
  }

  async channelClosed(peer) {
    this.open.delete(peer);
    return this.coordinating ? this._memberLeft(peer) : [];
  }

  /** A decoded message; `runId` is its frame header's. Messages of another run than the one
   * this peer follows are dropped (loudly); only a peer whose run ended takes a `run`
   * announce of a new one (as run.py). */
  async receive(sender, msg, runId = "") {
    if (runId && this.runId && runId !== this.runId && !(msg.T === "run" && this.ended && !this.coordinating)) {
      return [log(`a ${msg.T} message of run ${runId} from ${this._name(sender)}; this peer follows run ${this.runId}: dropped`, true)];
    }
    const handler = {
      run: this._onRun, ready: this._onReady, refuse: this._onRefuse, assign: this._onAssign,
      sync: this._onSync, data_request: this._onDataRequest, end: this._onEnd, restore: this._onRestore,
      contrib: this._onContrib, total: this._onTotal, state: this._onState, data: this._onData,
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

  // -- member side ---------------------------------------------------------------------------

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
    if (first || msg.term !== this.term) this.pending.clear(); // (the same announce again, on a reopened channel: work goes on)
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
    const tr = this.trainer;
    tr.theta.set(msg.theta);
    tr.adam.m.set(msg.m);
    tr.adam.v.set(msg.v);
    tr.adam.b1t = msg.b1t;
    tr.adam.b2t = msg.b2t;
    tr.adam.step = msg.step;
    tr.step = msg.step;
    this.pending.clear();
    await this._rehash();
    const out = [log(`synced to step ${msg.step} from ${sender} (params ${msg.params_sha256.slice(0, 12)})`)];
    if (restore) out.push({ kind: "restored", step: msg.step, params_sha256: msg.params_sha256, by: sender });
    if (this.coordinating) { // caught up with a member that was ahead: restart from there
      this.catchingUp = false;
      this.tasks.clear();
      this.checks.clear();
      this.stepStarted = false;
      for (const m of this.crew.values()) m.synced = false;
      return [...out, ...this._announceTargets().map((p) => send(p, this._announce()))];
    }
    return out;
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
    this.ended = true;
    return [{ kind: "ended", step: msg.step, params_sha256: this.sha,
      agreed: this.sha === msg.params_sha256 && msg.step === this.step }];
  }

  async _onData(sender, msg) {
    if (sender !== this.coord || !this.awaitingData) return [];
    return [{ kind: "dataBytes", data: msg.data }];
  }

  // -- coordinator side ----------------------------------------------------------------------

  _announceTargets() {
    return [...this.open].filter((p) => this.room.has(p) && p !== this.me).sort();
  }

  _becomeCoordinator() {
    this.coordinating = true;
    this.coord = this.me;
    this.term += 1;
    this.selfSpm = null;              // a term's first step warms up: timed from the next
    this.timingFrom = this.step + 1;
    this.crew = new Map();
    this.tasks = new Map();
    this.checks = new Map();
    this.stepStarted = false;
    this.pending.clear();
    return [log(`coordinating the run from step ${this.step} (term ${this.term})`),
      ...this._announceTargets().map((p) => send(p, this._announce()))];
  }

  /** This tab hosts a new run (the user pressed Start). */
  async hostRun(trainer, identity, runId, steps, now) {
    this.now = now;
    this.trainer = trainer;
    this.identity = identity;
    this.bounds = tensorBounds(trainer);
    this.steps = steps;
    this.refused = false;
    this.ended = false;
    this.doneBy = {};
    await this._rehash();
    this.run = { T: "run", identity, run_id: runId, steps, term: this.term, step: 0, params_sha256: this.sha, coordinator: this.me };
    if (this.host === null) this.host = this.me;
    // a new term and crew, announced to every open member: also when this tab already
    // coordinates (a second run after the first ended or was stopped: without the announce
    // the members still follow the old run and drop every assign of the new one)
    const out = this._becomeCoordinator();
    // members the run was announced to get a while to answer before the first step
    this.waitFor = new Set(this._announceTargets());
    this.waitUntil = now + START_WAIT_S;
    return [...out, ...this._maybeBegin()];
  }

  /**
   * The coordinator restores the whole room from a checked state {step, theta, m, v, b1t,
   * b2t, params_sha256}: loads it, opens a new term (open work is dropped) and sends each
   * member restore + STATE + run; training continues from `step` (to `steps`, if given).
   * Throws when this tab does not coordinate or the state does not fit the run.
   */
  async restore(st, now, steps = null) {
    if (!this.coordinating || !this.trainer) throw new Error("only the coordinator (the room's host) restores the room");
    const tr = this.trainer;
    const n = tr.theta.length;
    if (st.theta.length !== n || st.m.length !== n || st.v.length !== n) {
      throw new Error(`the state holds ${st.theta.length} parameters, the run's model ${n}`);
    }
    for (const a of [st.theta, st.m, st.v]) if (!a.every(Number.isFinite)) throw new Error("the state holds non-finite values");
    const sha = await paramsSha256(st.theta);
    if (st.params_sha256 && st.params_sha256 !== sha) throw new Error(`the state's parameters hash to ${sha}, not ${st.params_sha256}`);
    if (!Number.isInteger(st.step) || st.step < 0) throw new Error("the state's step is invalid");
    this.now = now;
    tr.theta.set(st.theta);
    tr.adam.m.set(st.m);
    tr.adam.v.set(st.v);
    tr.adam.b1t = st.b1t;
    tr.adam.b2t = st.b2t;
    tr.adam.step = st.step;
    tr.step = st.step;
    this.sha = sha;
    if (steps !== null) this.steps = steps;
    this.term += 1;
    this.restoredTerm = this.term;
    this.tasks = new Map();
    this.checks = new Map();
    this.stepStarted = false;
    this.catchingUp = false;
    this.ended = false;
    this.pending.clear();
    for (const m of this.crew.values()) {
      m.ready = false;
      m.synced = false;
    }
    const targets = this._announceTargets();
    this.waitFor = new Set(targets);
    this.waitUntil = now + RESTORE_WAIT_S;
    const out = [log(`restored the room from a checkpoint: step ${st.step}, params ${sha.slice(0, 12)} (term ${this.term})`),
      { kind: "restored", step: st.step, params_sha256: sha, by: this.me }];
    const state = this._state();
    const announce = this._announce();
    for (const p of targets) { // a member that never joined gets the state when it answers `run`
      const m = this.crew.get(p);
      if (m && !m.refused) out.push(send(p, { T: "restore", term: this.term, step: st.step, params_sha256: sha }), send(p, state));
      out.push(send(p, announce));
    }
    return [...out, ...this._maybeBegin()];
  }

  async stop(why) {
    if (!this.coordinating || this.ended) return [];
    this.steps = this.step; // end after the step in flight
    return [log(why), ...(this.stepStarted ? [] : this._maybeBegin())];
  }

  async _onReady(sender, msg) {
    if (!this.coordinating || msg.term !== this.term || this.ended) return [];
    if (this.banned.has(sender)) return [log(`${this._name(sender)} was removed from the run: its ready is ignored`, true)];
    const m = this._member(sender);
    m.capacity = Math.max(msg.capacity, 1e-3);
    m.kind = msg.kind;
    m.ready = true;
    m.refused = false;
    m.secPerMicro = 1.0 / m.capacity;
    if (msg.step === this.step && msg.params_sha256 === this.sha) {
      m.synced = true;
      return [log(`${sender} is ready (${msg.kind}, ${msg.capacity.toFixed(0)} micro-batches/s)`), ...this._maybeBegin()];
    }
    if (msg.step > this.step && this.restoredTerm !== this.term) {
      // it holds a later step than we do: take its state first (not after a restore: then
      // the restored state is the run's, wherever the member was)
      this.catchingUp = true;
      this.catchFrom = sender;
      this.catchUntil = this.now + SYNC_WAIT_S;
      return [log(`${sender} is ahead (step ${msg.step}): taking its state`),
        send(sender, { T: "sync", term: this.term, step: this.step, params_sha256: this.sha, reason: "coordinator behind" })];
    }
    m.synced = true; // by channel order the state arrives before the next assign / total
    return [log(`${sender} joins at step ${this.step}: sending the state`), send(sender, this._state()), ...this._maybeBegin()];
  }

  _member(id) {
    if (!this.crew.has(id)) this.crew.set(id, new Member(id));
    return this.crew.get(id);
  }

  _state() {
    const tr = this.trainer;
    return { T: "state", step: this.step, params_sha256: this.sha, theta: tr.theta.slice(),
      m: tr.adam.m.slice(), v: tr.adam.v.slice(), b1t: tr.adam.b1t, b2t: tr.adam.b2t };
  }

  async _onRefuse(sender, msg) {
    if (!this.coordinating) return [];
    const m = this._member(sender);
    m.refused = true;
    m.ready = false;
    m.synced = false;
    return [{ kind: "refused", peer: sender, reasons: msg.reasons }, ...(await this._memberLeft(sender, true)),
      ...this._maybeBegin()];
  }

  async _onSync(sender, msg) {
    if (!this.trainer) return [];
    const out = [];
    if (this.coordinating && msg.reason !== "coordinator behind") {
      out.push(log(`${sender} diverged at step ${msg.step} (params ${msg.params_sha256.slice(0, 12)}, ${msg.reason}): resyncing it`, true));
    }
    return [...out, send(sender, this._state())];
  }

  async _onDataRequest(sender, msg) {
    if (!this.trainer || msg.fingerprint !== this.trainer.ds.fingerprint || !this.trainer.ds.bytes) return [];
    return [send(sender, { T: "data", fingerprint: this.trainer.ds.fingerprint, data: this.trainer.ds.bytes })];
  }

  async _onContrib(sender, msg) {
    if (!this.coordinating || msg.term !== this.term || this.banned.has(sender)) return [];
    const size = this.trainer.layout.size;
    const bound = msg.micro.length * this.trainer.limit;
    const ints = msg.ints;
    if (!ints || ints.length !== size) {
      return this._strike(sender, "refused", null, `refused a contribution from ${this._name(sender)}: not ${size} integers`);
    }
    let peak = 0;
    for (let i = 0; i < ints.length; i++) { const a = Math.abs(ints[i]); if (a > peak) peak = a; }
    if (peak > bound) {
      return this._strike(sender, "refused", null, `refused a contribution from ${this._name(sender)}: a value of magnitude ${peak} is over the clamp bound ${bound} of ${msg.micro.length} micro-batch(es)`);
    }
    return this._takeContrib(sender, msg.step, msg.task, msg.micro, msg.ints, msg.loss, msg.correct);
  }

  /** Peers that take work this step, in a fixed order (self first). */
  _live() {
    const others = [...this.crew.values()]
      .filter((m) => m.synced && m.ready && !m.refused && this.room.has(m.id) && this.open.has(m.id) && !this.banned.has(m.id))
      .map((m) => m.id).sort();
    return [this.me, ...others];
  }

  _cap(peer) { return peer === this.me ? Number(this.capacity || 1.0) : this.crew.get(peer).capacity; }

  _answered(peer) {
    const m = this.crew.get(peer);
    return !!m && (m.ready || m.refused);
  }

  _maybeBegin() {
    if (this.stepStarted || this.catchingUp || !this.coordinating || this.ended) return [];
    if (this.step >= this.steps) return this._end();
    if (this.waitFor.size && this.now < this.waitUntil
        && [...this.waitFor].some((p) => this.room.has(p) && this.open.has(p) && !this._answered(p))) {
      return []; // give the members the run (or a restore) was announced to time to answer
    }
    this.waitFor = new Set();
    const live = this._live();
    if (live.length - 1 < this.waitPeers) return [];
    this.waitPeers = 0; // wait once, at the start
    return this._beginStep(live);
  }

  _beginStep(live) {
    this.stepStarted = true;
    this.tasks = new Map();
    this.checks = new Map();
    const n = this.trainer.hp.batch / this.trainer.hp.micro_batch;
    const ids = Array.from({ length: n }, (_, j) => j);
    const parts = capacitySplit(ids, this._splitWeights(live, n));
    const checked = new Set(live.length > 1 ? checkedMicro(this.verifyKey, this.step, n, this.verifyRate) : []);
    const fresh = [];
    const out = [];
    live.forEach((peer, i) => {
      const micro = parts[i];
      const plain = micro.filter((j) => !checked.has(j));
      if (plain.length) fresh.push(this._newTask(peer, plain));
      for (const j of micro) {
        if (checked.has(j)) { // its own task, and the same micro-batch for the next peer
          this.checks.set(j, { micro: j, votes: new Map(), decided: null, decidedBy: null, refereed: false });
          fresh.push(this._newTask(peer, [j]));
          fresh.push(this._newTask(live[(i + 1) % live.length], [j], "check"));
        }
      }
      if (!micro.length && peer !== this.me) {
        const sum = live.reduce((s, p) => s + this._cap(p), 0);
        out.push(log(`${this._name(peer)} gets no micro-batch of step ${this.step}: its capacity ${g3(this._cap(peer))} micro-batches/s is under 1/${n} of the room's ${g3(sum)}`));
      }
    });
    return [...out, ...this._dispatch(fresh)];
  }

  _newTask(peer, micro, kind = "main") {
    const t = { task: this.nextTask, micro, assignees: [peer], sentAt: this.now,
      deadline: this.now + this._deadline(peer, micro.length), result: null, kind };
    this.nextTask += 1;
    this.tasks.set(t.task, t);
    return t;
  }

  _deadline(peer, n) {
    const spm = peer === this.me ? 1.0 / Number(this.capacity || 1.0) : this.crew.get(peer).secPerMicro;
    return Math.max(MIN_DEADLINE_S, DEADLINE_FACTOR * spm * n + 0.5);
  }

  /** Tell the members about new assignments (`peers`: task -> the newly added assignee);
   * each member hears of its own tasks only. */
  _dispatch(tasks, peers = null) {
    if (!tasks.length) return [];
    const wire = tasks.map((t) => ({ task: t.task, peer: peers?.get(t.task) ?? t.assignees[t.assignees.length - 1], micro: t.micro }));
    const out = [];
    for (const p of this._receivers()) {
      const mine = wire.filter((w) => w.peer === p);
      if (mine.length) out.push(send(p, { T: "assign", term: this.term, step: this.step, tasks: mine }));
    }
    for (const w of wire) {
      if (w.peer === this.me) {
        this.pending.set(`${this.step}:${w.task}`, w.micro);
        out.push({ kind: "compute", step: this.step, task: w.task, micro: w.micro, theta: this.trainer.theta.slice() });
      }
    }
    return out;
  }

  /** Members that follow the run (get assigns and totals). */
  _receivers() {
    return [...this.crew.values()].filter((m) => m.ready && m.synced && !m.refused && this.open.has(m.id) && !this.banned.has(m.id))
      .map((m) => m.id).sort();
  }

  /** The capacities, or once a member's link is seen to cost time, shares that make
   * everyone finish together (finishShares), as run.py _split_weights. */
  _splitWeights(live, n) {
    const caps = live.map((p) => this._cap(p));
    const links = live.map((p, i) => (i === 0 ? 0.0 : this.crew.get(p).linkS));
    if (this.selfSpm === null || n < live.length || !links.some((x) => x > 0)) return caps;
    return finishShares(caps.map((c) => (this.selfSpm * caps[0]) / c), links, n);
  }

  /** As run.py _time_task: once a peer's last task of the step is in, the coordinator's
   * own seconds per micro-batch, and what each member's link adds beyond computing its
   * share at its relative capacity (the tasks it was first given: main and checks); a
   * term's first step and each member's first share are left out (warm-up). */
  _timeTask(sender, t) {
    if (t.assignees[0] !== sender || this.step < this.timingFrom) return;
    const share = [...this.tasks.values()].filter((x) => x.assignees[0] === sender);
    if (share.some((x) => !x.result)) return;
    const n = share.reduce((acc, x) => acc + x.micro.length, 0);
    const spent = this.now - Math.min(...share.map((x) => x.sentAt));
    if (!(spent > 0) || n === 0) return;
    if (sender === this.me) {
      const per = spent / n;
      this.selfSpm = this.selfSpm === null ? per : 0.5 * this.selfSpm + 0.5 * per;
    } else if (this.crew.has(sender) && this.selfSpm !== null) {
      const m = this.crew.get(sender);
      m.timed += 1;
      if (m.timed === 1) return;
      const own = (n * this.selfSpm * this._cap(this.me)) / this._cap(sender);
      m.linkS = 0.5 * m.linkS + 0.5 * Math.max(0.0, spent - own);
    }
  }

  async _takeContrib(sender, step, task, micro, ints, loss, correct) {
    const t = this.tasks.get(task);
    if (step !== this.step || !t || t.result || !sameInts(t.micro, micro) || !t.assignees.includes(sender)) {
      return []; // late, duplicate or not ours: ignored, the step counts each micro once
    }
    t.result = { peer: sender, ints, loss, correct };
    if (sender !== this.me && this.crew.has(sender)) {
      const m = this.crew.get(sender);
      const spent = Math.max(1e-4, this.now - t.sentAt) / micro.length;
      m.secPerMicro = 0.5 * m.secPerMicro + 0.5 * spent;
    }
    this._timeTask(sender, t);
    const out = [];
    if (t.micro.length === 1 && this.checks.has(t.micro[0])) {
      this.checks.get(t.micro[0]).votes.set(sender, { ints: Float64Array.from(ints), loss, correct });
      out.push(...(await this._judge(t.micro[0])));
    }
    return [...out, ...(await this._maybeCommit())];
  }

  async _maybeCommit() {
    if (!this.stepStarted || !this.tasks.size) return [];
    if ([...this.tasks.values()].every((x) => x.kind !== "main" || x.result)
        && [...this.checks.values()].every((c) => c.decided)) return this._commit();
    return [];
  }

  // -- spot-checks (run.py's rules) -----------------------------------------------------------

  _openFor(j) {
    return [...this.tasks.values()].filter((t) => t.micro.length === 1 && t.micro[0] === j && !t.result && t.assignees.length);
  }

  /** Compare the answers for spot-checked micro-batch j, bit for bit (see run.py _judge). */
  async _judge(j) {
    const c = this.checks.get(j);
    if (!c || c.decided || !c.votes.size) return [];
    const values = [];   // [{ints, peers}]
    for (const [peer, v] of c.votes) {
      const hit = values.find((x) => sameInts(x.ints, v.ints));
      if (hit) hit.peers.push(peer);
      else values.push({ ints: v.ints, peers: [peer] });
    }
    if (values.length === 1) {
      if (c.votes.size >= 2 || !this._openFor(j).length) return this._decide(j, c.votes.keys().next().value);
      return [];
    }
    if (c.votes.has(this.me)) return this._decide(j, this.me);
    const agreed = values.filter((x) => x.peers.length >= 2);
    if (agreed.length) return this._decide(j, agreed[0].peers[0]);
    if (c.refereed) return [];
    c.refereed = true;
    const who = [...c.votes.keys()].sort();
    return [log(`spot-check of micro-batch ${j} of step ${this.step}: ${who.map((p) => this._name(p)).join(" and ")} differ; the coordinator computes it`),
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
    if (n >= this.strikes) out.push(...(await this._remove(peer, n)));
    return out;
  }

  /** Remove a liar: it gets no more work or totals, and none of its answers of this step
   * that a spot-check did not confirm is used (they are computed again). */
  async _remove(peer, n) {
    this.banned.add(peer);
    const name = this.names.get(peer) ?? peer;
    const text = `liar removed: ${name} (${peer}) after ${n} strikes`;
    const out = [log(text, true), { kind: "alarm", alarm: "removed", peer, name, step: this.step, micro: null, strikes: n, text }];
    for (const t of this.tasks.values()) {
      if (t.result && t.result.peer === peer) {
        const c = t.micro.length === 1 ? this.checks.get(t.micro[0]) : undefined;
        if (!c || !c.decided) t.result = null;
      }
    }
    for (const c of this.checks.values()) if (!c.decided) c.votes.delete(peer);
    return [...out, ...(await this._memberLeft(peer, true, true))];
  }

  async _commit() {
    const size = this.trainer.layout.size;
    const total = new Float64Array(size);
    const per = {};
    let lossSum = 0;
    let n = 0;
    const mains = [...this.tasks.values()].filter((t) => t.kind === "main").sort((a, b) => a.task - b.task);
    for (const t of mains) {
      let { peer, ints, loss } = t.result;
      const c = t.micro.length === 1 ? this.checks.get(t.micro[0]) : undefined;
      if (c) { // a spot-checked micro-batch: the reference answer counts
        loss = c.decided.loss;
        if (!sameInts(ints, c.decided.ints)) {
          peer = c.decidedBy;
          ints = c.decided.ints;
        }
      }
      for (let i = 0; i < size; i++) total[i] += ints[i];
      per[peer] = (per[peer] || 0) + t.micro.length;
      lossSum += loss;
      n += t.micro.length; // loss: the mean over micro-batches of their mean (as daisychain train)
    }
    const contributors = Object.entries(per).sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    const step = this.step;
    this.trainer.apply(total);
    const sha = await this._rehash();
    const loss = lossSum / Math.max(n, 1);
    const receivers = this._receivers();
    this.stepStarted = false;
    this.tasks = new Map();
    this.checks = new Map();
    for (const k of [...this.pending.keys()]) if (Number(k.split(":")[0]) <= step) this.pending.delete(k);
    const committed = this._committed(step, loss, contributors, sha);
    // the next step's assign rides on each member's total: one message down per step
    const next = [];
    const carried = new Map();
    for (const o of this._maybeBegin()) {
      if (o.kind === "send" && o.message.T === "assign" && receivers.includes(o.to) && o.message.step === this.step && !carried.has(o.to)) {
        carried.set(o.to, o.message.tasks);
      } else {
        next.push(o);
      }
    }
    const out = receivers.map((p) => send(p, { T: "total", term: this.term, step, contributors, loss, params_sha256: sha,
      ints: total, tasks: carried.get(p) ?? [] }));
    return [...out, ...committed, ...next];
  }

  _committed(step, loss, contributors, sha) {
    for (const [peer, n] of contributors) this.doneBy[peer] = (this.doneBy[peer] || 0) + n;
    const mine = contributors.find(([p]) => p === this.me)?.[1] || 0;
    return [{ kind: "committed", step, loss, contributors, mine, params_sha256: sha }];
  }

  async _apply(ints, loss, contributors, sha, sender) {
    const step = this.step;
    this.trainer.apply(ints);
    for (const k of [...this.pending.keys()]) if (Number(k.split(":")[0]) <= step) this.pending.delete(k);
    const out = this._committed(step, loss, contributors, sha);
    const mine = await this._rehash();
    if (mine !== sha) {
      out.push(log(`PARAMETER HASH MISMATCH after step ${step}: ${mine.slice(0, 16)} here, ${sha.slice(0, 16)} at the coordinator: resyncing`, true));
      out.push(send(sender, { T: "sync", term: this.term, step: this.step, params_sha256: mine, reason: "hash mismatch" }));
    }
    return out;
  }

  async _memberLeft(peer, quiet = false, force = false) {
    if (!this.coordinating || peer === this.me) return [];
    if (this.catchingUp && peer === this.catchFrom) {
      this.catchingUp = false;
      return [log(`${this._name(peer)} left before sending its state: going on from step ${this.step}`, true),
        ...(await this._memberLeft(peer, quiet, force)), ...this._maybeBegin()];
    }
    const m = this.crew.get(peer);
    if (m && (!m.refused || force)) this.crew.delete(peer);
    const orphans = [];
    for (const t of this.tasks.values()) {
      const i = t.assignees.indexOf(peer);
      if (!t.result && i >= 0) {
        t.assignees.splice(i, 1);
        if (!t.assignees.length) orphans.push(t);
      }
    }
    const out = [];
    if (!orphans.length) {
      if (!quiet && m) out.push(log(`${this._name(peer)} left`));
    } else {
      const live = this._live();
      const fresh = [];
      for (const t of orphans) { // split its micro-batches over those still here
        this.tasks.delete(t.task);
        if (t.kind !== "main") continue; // a second opinion nobody gives: the check decides with the others
        const parts = capacitySplit(t.micro, live.map((p) => this._cap(p)));
        live.forEach((who, i) => { if (parts[i].length) fresh.push(this._newTask(who, parts[i])); });
      }
      const mains = orphans.filter((t) => t.kind === "main").flatMap((t) => t.micro);
      if (mains.length) out.push(log(`${this._name(peer)} left during step ${this.step}: its micro-batches ${pyList(mains)} go to the others`));
      out.push(...this._dispatch(fresh));
    }
    for (const j of [...this.checks.keys()].sort((a, b) => a - b)) out.push(...(await this._judge(j)));
    out.push(...(await this._maybeCommit()));
    return out;
  }

  async _checkDeadlines() {
    if (!this.stepStarted) return [];
    const late = [];
    const added = new Map();
    const dropped = [];
    const live = this._live();
    for (const t of [...this.tasks.values()]) {
      if (t.result || this.now < t.deadline) continue;
      let busy;
      if (t.kind !== "main" && this.checks.has(t.micro[0])) {
        const c = this.checks.get(t.micro[0]);
        if (c.decided) continue;
        busy = new Set(c.votes.keys());
        for (const u of this.tasks.values()) if (sameInts(u.micro, t.micro)) for (const p of u.assignees) busy.add(p);
      } else {
        busy = new Set(t.assignees);
      }
      const spare = live.filter((p) => !busy.has(p));
      if (!spare.length && t.kind !== "main") { // nobody else can give this second opinion: go without it
        dropped.push(t);
        continue;
      }
      if (!spare.length) {
        t.deadline = this.now + this._deadline(t.assignees[0], t.micro.length);
        continue;
      }
      const backup = spare.reduce((best, p) => {
        const kb = [this._cap(best), best === this.me];
        const kp = [this._cap(p), p === this.me];
        return kp[0] > kb[0] || (kp[0] === kb[0] && kp[1] && !kb[1]) ? p : best;
      });
      t.assignees.push(backup);
      t.sentAt = this.now;
      t.deadline = this.now + this._deadline(backup, t.micro.length);
      late.push(t);
      added.set(t.task, backup);
    }
    const out = [];
    const first = this.step < this.timingFrom; // a term's first step: no timing known, no miss
    if (late.length) {
      out.push(log(`task(s) ${pyList(late.map((t) => t.task))} of step ${this.step} ` + (first
        ? "also given to a backup (the first step's timings are not known yet)" : "missed the deadline: backup assigned")),
        ...this._dispatch(late, added));
    }
    if (dropped.length) {
      for (const t of dropped) this.tasks.delete(t.task);
      out.push(log(`spot-check(s) of micro-batch(es) ${pyList(dropped.map((t) => t.micro[0]))} of step ${this.step} ` +
        (first ? "skipped (the first step's timings are not known yet)" : "got no second answer in time: dropped")));
      for (const j of [...this.checks.keys()].sort((a, b) => a - b)) out.push(...(await this._judge(j)));
      out.push(...(await this._maybeCommit()));
    }
    return out;
  }

  _end() {
    this.ended = true;
    const msg = { T: "end", term: this.term, step: this.step, params_sha256: this.sha };
    return [...this._receivers().map((p) => send(p, msg)),
      { kind: "ended", step: this.step, params_sha256: this.sha, agreed: true }];
  }
}

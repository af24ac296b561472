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
// Messages are plain objects with `T` = run | ready | refuse | assign | sync | data_request |
// restore | end | contrib | total | state | data and the fields of frames.py's dataclasses.
//
// Hashes are async in the browser (crypto.subtle), so every entry point is async; the shell
// calls them one at a time.

import { paramsSha256, runIdentity } from "./engine/trainer.js";

export const MIN_DEADLINE_S = 2.0;
export const DEADLINE_FACTOR = 4.0;
/** How long a tab host waits, at the start, for the members it announced the run to. */
export const START_WAIT_S = 20.0;

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
    this.ready = false;
    this.synced = false;
    this.refused = false;
    this.secPerMicro = 1.0;
    this.answered = false;
  }
}

export class RunPeer {
  constructor(me, { kind = "cpu", capacity = null, makeTrainer = null, selftest = [true, "ok"] } = {}) {
    this.me = me;
    this.kind = kind;
    this.capacity = capacity;
    this.makeTrainer = makeTrainer; // async (identity, dataset) -> Trainer
    this.selftest = selftest;
    this.trainer = null;
    this.bounds = null;
    this.identity = null; // this replica's own identity of the run it holds
    this.sha = null;      // cached params hash of this.trainer
    this.steps = 0;
    this.waitUntil = 0;   // coordinator: wait for announced members until this time
    this.now = 0;
    this.host = null;
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
    this.restoring = null;   // member: {step, sha} a restore announced, until its STATE
    this.restoredTerm = -1;  // coordinator: this term's state came from a restore
  }

  get step() { return this.trainer ? this.trainer.step : 0; }

  get runId() { return this.run ? this.run.run_id : ""; }

  async _rehash() {
    this.sha = await paramsSha256(this.trainer.theta);
    return this.sha;
  }

  _announce() {
    return { T: "run", identity: this.identity, run_id: this.run.run_id, steps: this.steps,
      term: this.term, step: this.step, params_sha256: this.sha, coordinator: this.me };
  }

  // -- inputs --------------------------------------------------------------------------------

  async tick(now) {
    this.now = now;
    if (!this.coordinating || this.ended) return [];
    return [...this._checkDeadlines(), ...(await this._maybeBegin())];
  }

  async setMembers(ids, host) {
    const out = [];
    this.room = new Set(ids);
    const gone = [...this.crew.keys()].filter((m) => !this.room.has(m));
    const oldHost = this.host;
    this.host = host;
    if (host === this.me && !this.coordinating && this.trainer && this.run && !this.ended) {
      out.push(...this._becomeCoordinator(oldHost));
    } else if (host !== this.me && this.coordinating) {
      this.coordinating = false;
      out.push(log(`${host} is the coordinator now`));
    }
    for (const m of gone) out.push(...this._memberLeft(m));
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

  async receive(sender, msg) {
    const handler = {
      run: this._onRun, ready: this._onReady, refuse: this._onRefuse, assign: this._onAssign,
      sync: this._onSync, data_request: this._onDataRequest, end: this._onEnd, restore: this._onRestore,
      contrib: this._onContrib, total: this._onTotal, state: this._onState, data: this._onData,
    }[msg.T];
    if (!handler) return [log(`ignored a ${msg.T} message from ${sender}`)];
    return handler.call(this, sender, msg);
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
    if (this.host === null || step !== this.step) return [];
    return [send(this.host, { T: "contrib", term: this.term, step, task, micro, loss, correct, ints: result.grad })];
  }

  /** The dataset fetch finished: a parsed dataset with its fingerprint, or null. */
  async data(ds) {
    if (!this.awaitingData || !this.run) return [];
    const want = this.run.identity.dataset;
    if (ds && ds.fingerprint === want) {
      this.awaitingData = false;
      return this._prepared(ds);
    }
    if (this.host && this.host !== this.me) {
      return [log("the server has no matching dataset; asking the coordinator"),
        send(this.host, { T: "data_request", fingerprint: want })];
    }
    return this._refuse(["dataset fingerprint: no copy of the run's dataset found"]);
  }

  // -- member side ---------------------------------------------------------------------------

  async _onRun(sender, msg) {
    // As run.py: a higher term from anyone (a new host's announce can overtake the server's
    // room message that names it), the current term only from the coordinator we follow.
    if (this.refused || this.coordinating || msg.term < this.term
        || (msg.term === this.term && sender !== this.host)) return [];
    this.host = sender;
    const first = !this.run || msg.run_id !== this.run.run_id;
    this.term = msg.term;
    this.run = msg;
    this.steps = msg.steps;
    this.ended = false;
    this.pending.clear();
    if (this.trainer && !first) return [send(sender, this._ready())];
    if (this.trainer && first) {
      this.trainer = null; // another run: start over from its data
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
      { kind: "joined" }, send(this.host, this._ready())];
  }

  _ready() {
    return { T: "ready", term: this.term, capacity: Number(this.capacity || 1.0), kind: this.kind,
      step: this.step, params_sha256: this.sha };
  }

  _refuse(reasons) {
    this.refused = true;
    const out = [{ kind: "refused", peer: this.me, reasons }];
    if (this.host && this.host !== this.me) out.unshift(send(this.host, { T: "refuse", term: this.term, reasons }));
    return out;
  }

  async _onAssign(sender, msg) {
    if (this.coordinating || sender !== this.host || msg.term !== this.term || !this.trainer) return [];
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
    if (this.coordinating || sender !== this.host || !this.trainer) return [];
    if (msg.step < this.step) return [];
    if (msg.step > this.step) {
      return [log(`missed steps ${this.step}..${msg.step - 1}: resyncing`, true),
        send(sender, { T: "sync", term: this.term, step: this.step, params_sha256: this.sha, reason: "behind" })];
    }
    return this._apply(msg.ints, msg.loss, msg.contributors, msg.params_sha256, sender);
  }

  async _onState(sender, msg) {
    if (!this.trainer || (sender !== this.host && !this.coordinating)) return [];
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
    if (this.coordinating) {
      this.catchingUp = false;
      this.tasks.clear();
      this.stepStarted = false;
      for (const m of this.crew.values()) m.synced = false;
      return [...out, ...this._announceTargets().map((p) => send(p, this._announce()))];
    }
    return out;
  }

  /** The coordinator restored the room: the STATE that follows replaces ours. */
  async _onRestore(sender, msg) {
    if (this.refused || this.coordinating || !this.trainer || msg.term < this.term) return [];
    if (sender !== this.host) return [log(`a restore from ${sender}, who does not coordinate the run: ignored`, true)];
    this.term = msg.term;
    this.restoring = { step: msg.step, sha: msg.params_sha256 };
    this.pending.clear();
    this.ended = false;
    return [log(`${sender} restores the room from a checkpoint: step ${msg.step}, params ${msg.params_sha256.slice(0, 12)}`)];
  }

  async _onEnd(sender, msg) {
    if (sender !== this.host || !this.trainer || this.ended) return [];
    this.ended = true;
    return [{ kind: "ended", step: msg.step, params_sha256: this.sha,
      agreed: this.sha === msg.params_sha256 && msg.step === this.step }];
  }

  async _onData(sender, msg) {
    if (sender !== this.host || !this.awaitingData) return [];
    return [{ kind: "dataBytes", data: msg.data }];
  }

  // -- coordinator side ----------------------------------------------------------------------

  _announceTargets() {
    return [...this.open].filter((p) => this.room.has(p) && p !== this.me).sort();
  }

  _becomeCoordinator() {
    this.coordinating = true;
    this.term += 1;
    this.crew = new Map();
    this.tasks = new Map();
    this.stepStarted = false;
    this.pending.clear();
    const targets = this._announceTargets();
    return [log(`coordinating the run from step ${this.step} (term ${this.term})`),
      ...targets.map((p) => send(p, this._announce()))];
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
    this.host = this.me;
    const out = this._becomeCoordinator();
    this.waitUntil = now + START_WAIT_S;
    return [...out, ...(await this._maybeBegin())];
  }

  /**
   * The coordinator restores the whole room from a checked state {step, theta, m, v, b1t,
   * b2t, params_sha256}: loads it, opens a new term (open work is dropped) and sends each
   * member restore + STATE + run; training continues from `step` (to `steps`, if given).
   * Throws when this tab does not coordinate or the state does not fit the run.
   */
  async restore(st, now, steps = null) {
    if (!this.coordinating || !this.trainer) throw new Error("only the host (the coordinator) restores the room");
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
    this.stepStarted = false;
    this.catchingUp = false;
    this.ended = false;
    this.pending.clear();
    for (const m of this.crew.values()) {
      m.ready = false;
      m.synced = false;
      m.answered = m.refused;
    }
    this.waitUntil = now + START_WAIT_S;
    const out = [log(`restored the room from a checkpoint: step ${st.step}, params ${sha.slice(0, 12)} (term ${this.term})`),
      { kind: "restored", step: st.step, params_sha256: sha, by: this.me }];
    const state = this._state();
    const announce = this._announce();
    for (const p of this._announceTargets()) { // a member that never joined gets the state when it answers `run`
      const m = this.crew.get(p);
      if (m && !m.refused) out.push(send(p, { T: "restore", term: this.term, step: st.step, params_sha256: sha }), send(p, state));
      out.push(send(p, announce));
    }
    return [...out, ...(await this._maybeBegin())];
  }

  async stop(why) {
    if (!this.coordinating || this.ended) return [];
    this.steps = this.step; // end after the step in flight
    return [log(why), ...(this.stepStarted ? [] : await this._maybeBegin())];
  }

  async _onReady(sender, msg) {
    if (!this.coordinating || msg.term !== this.term || this.ended) return [];
    const m = this._member(sender);
    m.capacity = Math.max(msg.capacity, 1e-3);
    m.kind = msg.kind;
    m.ready = true;
    m.refused = false;
    m.answered = true;
    m.secPerMicro = 1.0 / m.capacity;
    if (msg.step === this.step && msg.params_sha256 === this.sha) {
      m.synced = true;
      return [log(`${sender} is ready (${msg.kind}, ${msg.capacity.toFixed(0)} micro-batches/s)`), ...(await this._maybeBegin())];
    }
    if (msg.step > this.step && this.restoredTerm !== this.term) { // not after a restore: then ours is the run's
      this.catchingUp = true;
      return [log(`${sender} is ahead (step ${msg.step}): taking its state`),
        send(sender, { T: "sync", term: this.term, step: this.step, params_sha256: this.sha, reason: "coordinator behind" })];
    }
    m.synced = true;
    return [log(`${sender} joins at step ${this.step}: sending the state`), send(sender, this._state())];
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
    m.answered = true;
    return [{ kind: "refused", peer: sender, reasons: msg.reasons }, ...this._memberLeft(sender, true),
      ...(await this._maybeBegin())];
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
    if (!this.coordinating || msg.term !== this.term) return [];
    return this._takeContrib(sender, msg.step, msg.task, msg.micro, msg.ints, msg.loss, msg.correct);
  }

  _live() {
    const others = [...this.crew.values()]
      .filter((m) => m.synced && m.ready && !m.refused && this.room.has(m.id) && this.open.has(m.id))
      .map((m) => m.id).sort();
    return [this.me, ...others];
  }

  _cap(peer) { return peer === this.me ? Number(this.capacity || 1.0) : this.crew.get(peer).capacity; }

  async _maybeBegin() {
    if (this.stepStarted || this.catchingUp || !this.coordinating || this.ended) return [];
    if (this.step >= this.steps) return this._end();
    if (this.now < this.waitUntil) {
      // At the start, wait (a while) for every member the run was announced to.
      const waiting = this._announceTargets().filter((p) => !this.crew.get(p)?.answered);
      if (waiting.length) return [];
    }
    this.waitUntil = 0;
    return this._beginStep(this._live());
  }

  _beginStep(live) {
    this.stepStarted = true;
    this.tasks = new Map();
    const n = this.trainer.hp.batch / this.trainer.hp.micro_batch;
    const ids = Array.from({ length: n }, (_, j) => j);
    const parts = capacitySplit(ids, live.map((p) => this._cap(p)));
    const fresh = [];
    live.forEach((peer, i) => { if (parts[i].length) fresh.push(this._newTask(peer, parts[i])); });
    return this._dispatch(fresh);
  }

  _newTask(peer, micro) {
    const t = { task: this.nextTask, micro, assignees: [peer], sentAt: this.now,
      deadline: this.now + this._deadline(peer, micro.length), result: null };
    this.nextTask += 1;
    this.tasks.set(t.task, t);
    return t;
  }

  _deadline(peer, n) {
    const spm = peer === this.me ? 1.0 / Number(this.capacity || 1.0) : this.crew.get(peer).secPerMicro;
    return Math.max(MIN_DEADLINE_S, DEADLINE_FACTOR * spm * n + 0.5);
  }

  _dispatch(tasks, peers = null) {
    if (!tasks.length) return [];
    const wire = tasks.map((t) => ({ task: t.task, peer: peers?.get(t.task) ?? t.assignees[t.assignees.length - 1], micro: t.micro }));
    const msg = { T: "assign", term: this.term, step: this.step, tasks: wire };
    const out = this._receivers().map((p) => send(p, msg));
    for (const w of wire) {
      if (w.peer === this.me) {
        this.pending.set(`${this.step}:${w.task}`, w.micro);
        out.push({ kind: "compute", step: this.step, task: w.task, micro: w.micro, theta: this.trainer.theta.slice() });
      }
    }
    return out;
  }

  _receivers() {
    return [...this.crew.values()].filter((m) => m.ready && m.synced && !m.refused && this.open.has(m.id))
      .map((m) => m.id).sort();
  }

  async _takeContrib(sender, step, task, micro, ints, loss, correct) {
    const t = this.tasks.get(task);
    if (step !== this.step || !t || t.result || t.micro.length !== micro.length
        || t.micro.some((j, i) => j !== micro[i]) || !t.assignees.includes(sender)) {
      return [];
    }
    t.result = { peer: sender, ints, loss, correct };
    if (sender !== this.me && this.crew.has(sender)) {
      const m = this.crew.get(sender);
      const spent = Math.max(1e-4, this.now - t.sentAt) / micro.length;
      m.secPerMicro = 0.5 * m.secPerMicro + 0.5 * spent;
    }
    if ([...this.tasks.values()].every((x) => x.result)) return this._commit();
    return [];
  }

  async _commit() {
    const size = this.trainer.layout.size;
    const total = new Float64Array(size);
    const per = {};
    let lossSum = 0;
    let n = 0;
    for (const t of [...this.tasks.values()].sort((a, b) => a.task - b.task)) {
      const { peer, ints, loss } = t.result;
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
    const msg = { T: "total", term: this.term, step, contributors, loss, params_sha256: sha, ints: total };
    const out = this._receivers().map((p) => send(p, msg));
    this.stepStarted = false;
    this.tasks = new Map();
    for (const k of [...this.pending.keys()]) if (Number(k.split(":")[0]) <= step) this.pending.delete(k);
    out.push(...this._committed(step, loss, contributors, sha));
    return [...out, ...(await this._maybeBegin())];
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
    const mine = await this._rehash();
    const out = this._committed(step, loss, contributors, sha);
    if (mine !== sha) {
      out.push(log(`PARAMETER HASH MISMATCH after step ${step}: ${mine.slice(0, 16)} here, ${sha.slice(0, 16)} at the coordinator: resyncing`, true));
      out.push(send(sender, { T: "sync", term: this.term, step: this.step, params_sha256: mine, reason: "hash mismatch" }));
    }
    return out;
  }

  _memberLeft(peer, quiet = false) {
    if (!this.coordinating || peer === this.me) return [];
    const m = this.crew.get(peer);
    if (m && !m.refused) this.crew.delete(peer);
    const orphans = [];
    for (const t of this.tasks.values()) {
      const i = t.assignees.indexOf(peer);
      if (!t.result && i >= 0) {
        t.assignees.splice(i, 1);
        if (!t.assignees.length) orphans.push(t);
      }
    }
    if (!orphans.length) return quiet || !m ? [] : [log(`${peer} left`)];
    const live = this._live();
    const fresh = [];
    for (const t of orphans) {
      this.tasks.delete(t.task);
      const parts = capacitySplit(t.micro, live.map((p) => this._cap(p)));
      live.forEach((who, i) => { if (parts[i].length) fresh.push(this._newTask(who, parts[i])); });
    }
    return [log(`${peer} left during step ${this.step}: its micro-batches ${JSON.stringify(orphans.flatMap((t) => t.micro))} go to the others`),
      ...this._dispatch(fresh)];
  }

  _checkDeadlines() {
    if (!this.stepStarted) return [];
    const late = [];
    const added = new Map();
    const live = this._live();
    for (const t of this.tasks.values()) {
      if (t.result || this.now < t.deadline) continue;
      const spare = live.filter((p) => !t.assignees.includes(p));
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
    if (!late.length) return [];
    return [log(`task(s) ${JSON.stringify(late.map((t) => t.task))} of step ${this.step} missed the deadline: backup assigned`),
      ...this._dispatch(late, added)];
  }

  _end() {
    this.ended = true;
    const msg = { T: "end", term: this.term, step: this.step, params_sha256: this.sha };
    return [...this._receivers().map((p) => send(p, msg)),
      { kind: "ended", step: this.step, params_sha256: this.sha, agreed: true }];
  }
}

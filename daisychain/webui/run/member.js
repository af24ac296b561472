// The member role (daisychain/peer/run/member.py): the replica (its trainer and the run it
// follows). Follow the coordinator that announced the run, compute the tasks it assigns, apply
// each step's total and compare hashes, take a STATE when behind or restored, serve its state
// and dataset to whoever asks, and leave when removed. While this tab coordinates, its
// Coordinator (coordinator.js) reads the replica through Member's narrow interface (trainer,
// bounds, identity, step, sha, rehash(), state(), load(), committed()); the member itself then
// only serves the run's dataset.

import { paramsSha256, runIdentity } from "../engine/trainer.js";
import { checkedState, loadState, tensorBounds } from "./state.js";
import { g3, log, send, setting } from "./util.js";
import { committed, compute, dataBytes, ended, fetchData, joined, refused, removed, restored } from "./outputs.js";
import { RingMember } from "./ring_roles.js";
import { Window, windowSteps } from "./rollback.js";

const IDENTITY_NAMES = { model: "model spec", hyper: "hyperparameters", dataset: "dataset fingerprint",
  luts: "LUT manifest", engine: "engine version", seed: "seed", task: "task", exp_lut: "exp table",
  output_rounding: "output error rounding", error_rounding: "backward error rounding" }; // engine/trainer.py identity_differences' names

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

// member.py HOLD_S: how long a run announce from a peer that the signaling server has not
// named the room's host is held (a hand-over's announce can overtake the server's room
// message) before it is refused and its sender struck.
export const HOLD_S = 20.0;

export class Member {
  /** `peer`: the run context (context.js: the driver's settings, room, names, clock; read-only). */
  constructor(peer) {
    this.peer = peer;
    this.trainer = null;
    this.bounds = null;
    this.identity = null;  // this replica's own identity of the run it holds
    this.sha = null;       // cached params hash of this.trainer
    this.term = 0;
    this.run = null;       // the announce we follow
    this.coord = null;     // the coordinator whose announce we follow
    this.ended = false;
    this.refused = false;
    this.pending = new Map(); // "step:task" -> micro
    this.awaitingData = false;
    this.restoring = null; // {step, sha} a restore announced, until its STATE
    this.aggregation = new RingMember(this); // its side of each step's sum (aggregator.js): a ring's, else the star's
    // the rollback window of this replica (rollback.js): kept by every member, so that a
    // coordinator built from it (hand-over) can roll back lies from before its term
    this.window = null;
    this.removed = new Set(); // peers removed from the run (liars), as announced
    // who coordinates is the server's word: a run announce from a peer it has not named the
    // room's host waits here (the latest per sender, until HOLD_S after the first)
    this.held = new Map(); // sender -> {msg, until}
    this.struck = new Set(); // peers whose held announce the server never confirmed
    // named host without the run, its coordinator gone: the announces members forward
    // (sender -> {msg, at}); followed once two agree (member.py _forwarded)
    this.forwards = new Map();
    this.forwardedTo = null; // the new host we forwarded our announce to
    this.answered = null; // "term:step" of the last STATE we sent
    this.dataSent = new Set(); // peers sent the run's dataset
  }

  // -- the narrow interface a coordinator reads the replica through ------------------------

  get step() { return this.trainer ? this.trainer.step : 0; }

  async rehash() {
    this.sha = await paramsSha256(this.trainer.theta);
    return this.sha;
  }

  /** This replica's whole state as a STATE message. */
  async state() {
    const st = await this.trainer.wireState(); // a local-steps run's whole round state
    return { T: "state", step: st.step, params_sha256: this.sha, theta: st.theta, m: st.m, v: st.v, b1t: st.b1t, b2t: st.b2t };
  }

  /** Take a whole checked state (the one state loader, state.js). */
  async load(st) {
    await loadState(this.trainer, st);
    this.pending.clear();
    if (this.window) await this.window.rebase(this.trainer); // keeps the steps before it if they lead to it
    else await this.windowFor();
    return this.rehash();
  }

  /** member.py window_for: this replica's rollback window, made at its first use in a run
   * (from the state then); the coordinator's too while this tab coordinates (one object). */
  async windowFor() {
    if (!this.window) {
      const p = this.peer;
      this.window = new Window(p.windowSize ?? windowSteps(p.verifyRate, p.strikes), this.bounds);
      await this.window.reset(this.trainer);
    }
    return this.window;
  }

  /** A step was committed (applied here): who did what (the driver counts it). */
  committed(step, loss, contributors, sha) {
    const mine = contributors.find(([p]) => p === this.peer.me)?.[1] || 0;
    return [committed(step, loss, contributors, mine, sha)];
  }

  // -- hand-over -----------------------------------------------------------------------------

  /** This tab starts coordinating: its own tasks as a member are dropped. */
  lead() {
    this.coord = this.peer.me;
    this.pending.clear();
    this.aggregation.drop(); // the coordinator's sum is its own
    this.restoring = null;
  }

  /** This tab's coordinator was dropped: the member goes on from its term and announce (a
   * new host's announce has a later term). */
  followAfter(coordinator) {
    this.term = coordinator.term;
    this.run = coordinator.run;
    this.ended = coordinator.ended;
  }

  /** This tab hosts a new run on `trainer`: the replica and the announce it starts from. */
  async host(trainer, identity, runId) {
    this.trainer = trainer;
    this.identity = identity;
    this.bounds = tensorBounds(trainer);
    this.refused = false;
    this.ended = false;
    this.window = null; // a new run: its own window and removed list
    this.removed = new Set();
    await this.rehash();
    const p = this.peer;
    this.run = { T: "run", identity, run_id: runId, steps: p.steps, term: this.term, step: 0, params_sha256: this.sha, coordinator: p.me };
  }

  // -- inputs --------------------------------------------------------------------------------

  async computed(step, task, result, term = null) {
    if (term !== null && term !== this.term) return []; // asked in an older term: the task number may be another task now
    const key = `${step}:${task}`;
    const micro = this.pending.get(key);
    if (micro === undefined || this.ended) return [];
    this.pending.delete(key);
    if (this.coord === null || step !== this.step) return [];
    let loss = 0;
    for (const l of result.loss) loss += l;
    let correct = 0;
    for (const c of result.correct) correct += c;
    return this.aggregation.computed(step, task, micro, result.grad, loss, correct);
  }

  /** The dataset fetch finished: a parsed dataset with its fingerprint, or null. */
  async data(ds) {
    if (!this.awaitingData || !this.run) return [];
    const want = this.run.identity.dataset;
    if (ds && ds.fingerprint === want) {
      this.awaitingData = false;
      return this._prepared(ds);
    }
    if (this.coord && this.coord !== this.peer.me) {
      return [log("the server has no matching dataset; asking the coordinator"),
        send(this.coord, { T: "data_request", fingerprint: want })];
    }
    return this._refuse(["dataset fingerprint: no copy of the run's dataset found"]);
  }

  /** `handed`: the host named before, when _forwarded just took it to be `sender` (its setting
   * is not applied yet). */
  async onRun(sender, msg, handed = null) {
    // A higher term only from the host the server names (an announce that overtook the room
    // message naming its sender is held), the current term only from the coordinator we follow.
    // (the current term from another sender only when the server names it host: two members that
    // took over one after the other from the same term both announce term + 1)
    if (this.refused || msg.term < this.term || (msg.term === this.term && sender !== this.coord && sender !== this.peer.host)) return [];
    const p = this.peer;
    // named host before it held the run: it follows the host named before it to get the replica,
    // then leads (driver.js _leadIfNamed); nobody coordinated before
    const handing = p.host === p.me && !this.trainer && sender === (handed ?? p.prevHost);
    if (p.host === p.me && !this.run && !handing && !p.room.has(msg.coordinator)) return this._forwarded(sender, msg);
    if (sender !== p.host && !(msg.term === this.term && sender === this.coord) && !handing) return this._hold(sender, msg);
    this.held.delete(sender);
    // a restore announced by the one before is void (it died before its STATE came, and the new
    // host's state was ignored: seed 5559)
    if (sender !== this.coord) this.restoring = null;
    this.coord = sender;
    const settings = [setting("steps", msg.steps), setting("verifyRate", msg.verify_rate ?? 0.0),
      setting("strikes", msg.strikes ?? p.strikes)];
    const first = !this.run || msg.run_id !== this.run.run_id;
    if (first) { // another run: its own window and removed list
      this.window = null;
      this.removed = new Set();
    }
    for (const q of msg.removed ?? []) this.removed.add(q);
    if (first || msg.term !== this.term) {
      this.pending.clear(); // (the same announce again, on a reopened channel: work goes on)
      this.aggregation.drop();
    }
    this.term = msg.term;
    this.run = msg;
    this.ended = false;
    if (this.trainer && !first) return [...settings, send(sender, this._ready())];
    if (this.trainer && first) { // another run (ours ended): start over from its data
      this.trainer = null;
      this.bounds = null;
    }
    this.awaitingData = true;
    return [...settings, fetchData(String(msg.identity.task || ""), String(msg.identity.dataset || ""))];
  }

  /** member.py _hold: an announce from a peer that the server has not named the room's host,
   * held until it does, refused when it does not within HOLD_S. */
  _hold(sender, msg) {
    const p = this.peer;
    if (!p.room.has(sender)) return [log(`a run announce from ${p._name(sender)}, who is not in the room: refused`, true)];
    const first = !this.held.has(sender);
    const until = first ? p.now + HOLD_S : this.held.get(sender).until;
    this.held.set(sender, { msg, until });
    if (!first || this.struck.has(sender)) return [];
    return [log(`a run announce (term ${msg.term}) from ${p._name(sender)}, whom the server has not named the room's host (it names ${p.host}): held until it does`, true)];
  }

  /** member.py _forwarded: the named host, without the run, its coordinator gone: a member
   * forwarded its announce. Followed (then led) once two members forwarded the same run, or the
   * sender is the only other member, or HOLD_S passed with no other run forwarded (tick); before,
   * nobody could lead (seeds 1255, 1786). */
  async _forwarded(sender, msg, follow = false) {
    const p = this.peer;
    if (!p.room.has(sender) || sender === p.me) return [];
    if (!this.forwards.has(sender)) this.forwards.set(sender, { msg, at: p.now });
    const same = [...this.forwards.values()].filter((f) => f.msg.run_id === msg.run_id).length;
    const others = [...p.room].filter((q) => q !== p.me);
    if (!(follow || same >= 2 || (others.length === 1 && others[0] === sender))) return [];
    this.forwards.clear();
    // (onRun's hand-over from the host before: this one)
    return [setting("prevHost", sender),
      log(`the coordinator ${msg.coordinator} left before this peer held the run: following its announce from ${p._name(sender)} to lead`),
      ...(await this.onRun(sender, msg, sender))];
  }

  /** member.py host_named: the room changed; a held announce of the host it names is followed
   * now, those of peers that left are dropped. When the coordinator we follow left and the
   * server names another host, that host gets our announce (it may not hold the run). */
  async hostNamed() {
    const p = this.peer;
    for (const peer of [...this.held.keys()]) if (!p.room.has(peer)) this.held.delete(peer);
    const held = p.host ? this.held.get(p.host) : undefined;
    if (held) {
      this.held.delete(p.host);
      return this.onRun(p.host, held.msg);
    }
    const host = p.host;
    if (host === p.me && !this.run) { // forwards that came before the room said so
      const out = [];
      for (const [peer, { msg }] of [...this.held]) {
        if (!p.room.has(msg.coordinator) && !this.run) {
          this.held.delete(peer);
          out.push(...(await this._forwarded(peer, msg)));
        }
      }
      return out;
    }
    if (this.run && this.trainer && !this.refused && host && host !== p.me && host !== this.coord
        && !p.room.has(this.coord) && host !== this.forwardedTo) {
      this.forwardedTo = host;
      return [send(host, this.run)];
    }
    return [];
  }

  /** member.py tick: held announces the server did not confirm within HOLD_S are refused and
   * their senders struck (their announces are ignored unless the server names them host). */
  async tick() {
    const p = this.peer;
    const out = [];
    const fw = [...this.forwards.entries()];
    if (fw.length && !this.run && new Set(fw.map(([, f]) => f.msg.run_id)).size === 1
        && p.now >= Math.min(...fw.map(([, f]) => f.at)) + HOLD_S) {
      fw.sort((a, b) => a[1].at - b[1].at || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
      out.push(...(await this._forwarded(fw[0][0], fw[0][1].msg, true)));
    }
    for (const [peer, { msg, until }] of this.held) {
      if (p.now >= until && !this.struck.has(peer)) {
        this.struck.add(peer);
        out.push(log(`refused a run announce (term ${msg.term}) from ${p._name(peer)}: the server did not name it the room's host within ${g3(HOLD_S)} s; ${peer} is struck (its announces are ignored while the server names another host)`, true));
      }
    }
    return out;
  }

  async _prepared(ds) {
    try {
      this.trainer = await this.peer.makeTrainer(this.run.identity, ds);
    } catch (err) {
      return this._refuse([`cannot build the run here: ${err.message}`]);
    }
    this.identity = runIdentity(this.trainer.spec, this.trainer.hp, ds, this.trainer.luts);
    this.bounds = tensorBounds(this.trainer);
    await this.rehash();
    return this._checkIdentity();
  }

  _checkIdentity() {
    const reasons = identityDifferences(this.identity, this.run.identity);
    if (!this.peer.selftest[0]) reasons.push(`self-test failed: ${this.peer.selftest[1]}`);
    if (reasons.length) return this._refuse(reasons);
    return [log(`joined run ${this.run.run_id} (step ${this.run.step} of ${this.run.steps})`),
      joined(), send(this.coord, this._ready())];
  }

  _ready() {
    return { T: "ready", term: this.term, capacity: Number(this.peer.capacity || 1.0), kind: this.peer.kind,
      step: this.step, params_sha256: this.sha };
  }

  _refuse(reasons) {
    this.refused = true;
    const out = [refused(this.peer.me, reasons)];
    if (this.coord && this.coord !== this.peer.me) out.unshift(send(this.coord, { T: "refuse", term: this.term, reasons }));
    return out;
  }

  async onAssign(sender, msg) {
    if (sender !== this.coord || msg.term !== this.term || !this.trainer) return [];
    if (msg.step !== this.step) return [];
    const out = [];
    for (const t of msg.tasks) {
      const key = `${msg.step}:${t.task}`;
      if (t.peer === this.peer.me && !this.pending.has(key)) {
        this.pending.set(key, t.micro);
        out.push(compute(msg.step, t.task, t.micro, this.trainer.theta.slice(), this.term));
      }
    }
    return out;
  }

  async onTotal(sender, msg) {
    if (sender !== this.coord || !this.trainer) return [];
    if (msg.step < this.step) return [];
    if (msg.step > this.step) {
      return [log(`missed steps ${this.step}..${msg.step - 1}: resyncing`, true),
        send(sender, { T: "sync", term: this.term, step: this.step, params_sha256: this.sha, reason: "behind" })];
    }
    for (const p of msg.removed ?? []) this.removed.add(p);
    const out = await this._apply(msg.ints, msg.loss, msg.contributors, msg.params_sha256, sender, msg.unchecked ?? [],
      msg.encoded ?? null);
    if (msg.tasks?.length && msg.term === this.term && this.sha === msg.params_sha256) {
      // the next step's tasks, started the moment the total is applied (not on a replica
      // that just diverged: it waits for its STATE; a backup takes the task)
      out.push(...(await this.onAssign(sender, { T: "assign", term: msg.term, step: msg.step + 1, tasks: msg.tasks })));
    }
    return out;
  }

  async onState(sender, msg) {
    if (!this.trainer || sender !== this.coord) return [];
    const restore = this.restoring;
    this.restoring = null;
    if ((await paramsSha256(msg.theta.subarray(0, this.trainer.layout.size))) !== msg.params_sha256) {
      return [log(`state from ${sender} does not match its hash: ignored`, true)];
    }
    if (!restore && msg.step === this.step && msg.params_sha256 === this.sha) {
      // this replica's own state (a ready of ours overtaken by the step it named: the
      // coordinator answered it with the state we reached since): the work of this step
      // under way (a ring, a task) goes on (seed 11794: the ring was dropped, its commit lost)
      return [log(`state from ${sender} is this replica's own (step ${msg.step}, params ${msg.params_sha256.slice(0, 12)}): kept`)];
    }
    if (restore && (restore.step !== msg.step || restore.sha !== msg.params_sha256)) {
      return [log(`restore from ${sender}: the state (step ${msg.step}, params ${msg.params_sha256.slice(0, 12)}) is not the announced checkpoint (step ${restore.step}, params ${restore.sha.slice(0, 12)}): ignored`, true)];
    }
    let st;
    try {
      st = await checkedState(this.trainer, msg);
    } catch (err) {
      return [log(`state from ${sender}: ${err.message}: ignored`, true)];
    }
    await this.load(st);
    const out = [log(`synced to step ${msg.step} from ${sender} (params ${msg.params_sha256.slice(0, 12)})`)];
    if (restore) out.push(restored(msg.step, msg.params_sha256, sender));
    return [...out, ...(await this.aggregation.synced())]; // (a held ring plan of this step starts)
  }

  /** The coordinator restored the room: the STATE that follows replaces ours. */
  async onRestore(sender, msg) {
    if (this.refused || !this.trainer || msg.term < this.term) return [];
    if (sender !== this.coord && sender !== this.peer.host) {
      return [log(`a restore from ${sender}, who does not coordinate the run: ignored`, true)];
    }
    this.coord = sender;
    this.term = msg.term;
    this.restoring = { step: msg.step, sha: msg.params_sha256 };
    this.pending.clear();
    this.ended = false;
    return [log(`${sender} restores the room from a checkpoint: step ${msg.step}, params ${msg.params_sha256.slice(0, 12)}`)];
  }

  async onEnd(sender, msg) {
    if (sender !== this.coord || !this.trainer || this.ended) return [];
    if (this.aggregation.holdsEnd(msg)) return []; // (our ring's last total is still gathering)
    this.ended = true;
    return [ended(msg.step, this.sha, this.sha === msg.params_sha256 && msg.step === this.step)];
  }

  async onData(sender, msg) {
    if (sender !== this.coord || !this.awaitingData) return [];
    return [dataBytes(msg.data)];
  }

  /** member.py on_syncrequest: the coordinator we follow asks for this replica's state (a new
   * coordinator that is behind), answered once per term and step; anyone else is not answered. */
  async onSync(sender, msg) {
    if (!this.trainer || sender !== this.coord || msg.term !== this.term) return [];
    const key = `${this.term}:${this.step}`;
    if (this.answered === key) return [];
    this.answered = key;
    return [send(sender, await this.state())];
  }

  /** member.py on_datarequest: the run's dataset, once per peer that asks. */
  async onDataRequest(sender, msg) {
    if (!this.trainer || msg.fingerprint !== this.trainer.ds.fingerprint || !this.trainer.ds.bytes
        || this.dataSent.has(sender)) return [];
    this.dataSent.add(sender);
    return [send(sender, { T: "data", fingerprint: this.trainer.ds.fingerprint, data: this.trainer.ds.bytes })];
  }

  async _apply(ints, loss, contributors, sha, sender, unchecked = [], encoded = null) {
    const step = this.step;
    const why = this.trainer.contributionError?.(ints, Array.from({ length: this.trainer.nTasks }, (_, j) => j), step); // local steps
    if (why) return [log(`a total of step ${step} from ${this.peer._name(sender)} that no replica makes (${why}): ignored`, true)];
    const window = await this.windowFor();
    await this.trainer.apply(ints);
    await window.record(this.trainer, step, ints, unchecked, encoded); // the body as it came: not encoded again
    for (const k of [...this.pending.keys()]) if (Number(k.split(":")[0]) <= step) this.pending.delete(k);
    const out = this.committed(step, loss, contributors, sha);
    const mine = await this.rehash();
    if (mine !== sha) {
      out.push(log(`PARAMETER HASH MISMATCH after step ${step}: ${mine.slice(0, 16)} here, ${sha.slice(0, 16)} at the coordinator: resyncing`, true));
      out.push(send(sender, { T: "sync", term: this.term, step: this.step, params_sha256: mine, reason: "hash mismatch" }));
    }
    return out;
  }

  /** The coordinator removed this replica from the run (`reasons`: why). */
  async onRefuse(sender, msg) {
    // (a new host the server names may say it again: the one that removed it died first; the
    // host named before may say it in the term before: its refuse overtaken by a step-down, seed 7306)
    const before = sender === this.peer.prevHost && msg.term < this.term;
    if ((sender !== this.coord && sender !== this.peer.host && !before) || this.refused) return [];
    this.refused = true;
    this.ended = true;
    this.pending.clear();
    const reason = msg.reasons.join("; ");
    return [log(`removed from the run by ${this.peer._name(sender)}: ${reason}`, true), removed(sender, reason)];
  }
}

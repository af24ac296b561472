// The coordinator role (daisychain/peer/run/coordinator.py), the room host: announce the run,
// admit members, split each step into tasks (split.js), dispatch them, give late ones a
// backup, collect contributions and commit the step's total (aggregator.js) to everyone;
// restore the room from a state. A Coordinator is built from this tab's Member (member.js) when
// the tab becomes the room's host (hand-over) and dropped when it steps down. It reads the
// replica only through the member's narrow interface (trainer, bounds, identity, step, sha,
// rehash(), state(), load(), committed()) and the room through the driver; every attribute of
// the coordinating (crew, tasks, checks) lives here. It holds its trust in the members, a Trust
// (trust.js: strikes, the removed list, the rollback window), and delegates to it; the
// catch-up (catchup.js) is its methods.

import { Star } from "./aggregator.js";
import { finishShares } from "./split.js";
import { isLocal } from "../engine/spec.js";
import { Window } from "./rollback.js";
import { Trust } from "./trust.js";
import { CatchUpRole, SYNC_WAIT_S } from "./catchup.js";
import { log, pastBound, pyList, sameInts, send, setting } from "./util.js";
import { compute, ended, refused } from "./outputs.js";
import { RingCoordinator } from "./ring_roles.js";
import { withEncoded } from "../wire/messages.js";

export const MIN_DEADLINE_S = 2.0;
export const DEADLINE_FACTOR = 4.0;
/** How long a host waits, at the start, for the members it announced the run to. */
export const START_WAIT_S = 20.0;
/** After a restore, how long the coordinator waits for the members to load the state. */

export class CrewMember {
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
    this.ahead = null;     // [step, params hash] it said it holds, past ours
    this.aheadUntil = 0;   // ... until then another member may confirm it
    this.answered = null;  // "term:step" of the last sync request answered
  }
}

export class Coordinator {
  /** `peer`: the run context (context.js, read-only: settings, room, clock); `member`: this
   * tab's replica, which the coordinator commits to. */
  constructor(peer, member) {
    this.peer = peer;
    this.member = member;
    member.lead();
    this.runId = member.run.run_id;
    this.term = member.term + 1;
    this.ended = member.ended;
    this.waitPeers = peer.waitPeers; // the host waits once, at the start (the driver's ends now)
    this.steps = peer.steps; // the run's length (a restore or a stop changes it: a setting tells the driver)
    this.crew = new Map();
    this.tasks = new Map();
    this.checks = new Map();
    this.nextTask = 0;
    this.pending = new Map(); // our own tasks: "step:task" -> micro
    this.ownMicro = new Map(); // ... -> their micro-batch count, until the shell times them
    this.ownSpm = null;       // our own seconds per micro-batch, from every compute the shell timed
    this.stepStarted = false;
    this.selfSpm = null;      // our own seconds per micro-batch
    this.selfFixed = 0.0;     // what our own share waits beyond its compute (the step's handling)
    this.timingFrom = this.step + 1; // ... timed from this step on (a term's first warms up)
    this.excused = new Set(); // peers whose first share's lateness was excused (once)
    this.catchingUp = false;
    this.catchFrom = null;    // the member ahead whose state we asked for
    this.catchUntil = 0;
    this.catchReport = null;      // the [step, hash] we asked it for
    this.askedState = new Set();  // members we asked for their state
    this.restoredTerm = -1;   // this term's state came from a restore
    this.waitFor = new Set(); // members to hear from before a step
    this.waitUntil = 0;
    // strikes, the liars removed from the run (handed over) and the rollback window (the
    // member's, from begin())
    this.trust = new Trust(this, member.removed, new Window(0));
    this.run = null;          // our announce (made by begin())
    // how a step is summed (aggregator.js): the ring, which hands the star the steps it does
    // not sum (every step, with --aggregate star)
    this.aggregation = new RingCoordinator(this, new Star(this));
  }

  // -- what the coordinator reads: the replica through the member, the room through the peer

  get trainer() { return this.member.trainer; }
  get bounds() { return this.member.bounds; }
  get identity() { return this.member.identity; }
  get step() { return this.member.step; }
  get sha() { return this.member.sha; }
  /** The peers removed from the run (liars): the trust's, read only. */
  get banned() { return this.trust.removed; }
  /** The rollback window: the trust's, read only. */
  get window() { return this.trust.window; }
  _rehash() { return this.member.rehash(); }
  _name(peer) { return this.peer._name(peer); }

  _announce() {
    return { T: "run", identity: this.identity, run_id: this.runId, steps: this.steps,
      term: this.term, step: this.step, params_sha256: this.sha, coordinator: this.me,
      verify_rate: this.verifyRate, strikes: this.strikes, removed: [...this.banned].sort() };
  }

  _announceTargets() {
    return [...this.open].filter((p) => this.room.has(p) && p !== this.me && !this.banned.has(p)).sort();
  }

  /** Announce the run (a new term) to everyone with an open channel. */
  async begin() {
    await this._newWindow();
    this.run = this._announce();
    return [log(`coordinating the run from step ${this.step} (term ${this.term})`),
      ...this._announceTargets().map((p) => send(p, this._announce())), ...this.trust.tellRemoved()];
  }

  /** The host of a new run: members it was announced to get a while to answer first. */
  start() {
    this.waitFor = new Set(this._announceTargets());
    this.waitUntil = this.now + START_WAIT_S;
    return this._maybeBegin();
  }

  async tick() {
    if (this.ended) return [];
    return [...(await this._checkCatchUp()), ...(await this.aggregation.deadline()), ...this._maybeBegin()];
  }

  /** The signaling room changed: members no longer in it left. */
  async roomLeft() {
    const out = [];
    for (const m of [...this.crew.keys()].filter((id) => !this.room.has(id))) out.push(...(await this._memberLeft(m)));
    return out;
  }

  channelOpen(peer) {
    return this.run && !this.ended ? [send(peer, this._announce())] : [];
  }

  async badMessage(sender, reason) {
    const text = `refused a message from ${this._name(sender)}: ${reason}`;
    if (this.crew.has(sender) && !this.banned.has(sender)) return this.trust.strike(sender, "refused", null, text);
    return [log(text, true)];
  }

  /** coordinator.py compute_took: the shell timed our own compute of `task` (before computed). */
  computeTook(step, task, seconds) {
    const t = this.tasks.get(task);
    if (t !== undefined && step === this.step && seconds >= 0) t.busyS = Number(seconds);
    const key = `${step}:${task}`;
    const n = this.ownMicro.get(key) ?? 0;
    this.ownMicro.delete(key);
    if (n && seconds >= 0 && step >= this.timingFrom) { // (run/coordinator.py compute_took: own_spm)
      const per = Number(seconds) / n;
      this.ownSpm = this.ownSpm === null ? per : 0.5 * this.ownSpm + 0.5 * per;
    }
  }

  async computed(step, task, result, term = null) {
    if (term !== null && term !== this.term) return []; // asked in another term: its task numbers differ
    const key = `${step}:${task}`;
    const micro = this.pending.get(key);
    if (micro === undefined || this.ended) return [];
    this.pending.delete(key);
    let loss = 0;
    for (const l of result.loss) loss += l;
    let correct = 0;
    for (const c of result.correct) correct += c;
    return this.aggregation.computed(step, task, micro, result.grad, loss, correct);
  }

  async stop(why) {
    if (this.ended) return [];
    this.steps = this.step; // end after the step in flight
    return [setting("steps", this.steps), log(why), ...(this.stepStarted ? [] : this._maybeBegin())];
  }

  async onReady(sender, msg) {
    if (msg.term !== this.term) return [];
    if (this.banned.has(sender)) return [log(`${this._name(sender)} was removed from the run: its ready is ignored`, true)];
    if (this.ended) return this._lateEnd(sender, msg); // it answered our announce after the last step
    const m = this._member(sender);
    m.capacity = Math.max(msg.capacity, 1e-3);
    m.kind = msg.kind;
    m.ready = true;
    m.refused = false;
    m.secPerMicro = 1.0 / m.capacity;
    m.ahead = null;
    if (msg.step === this.step && msg.params_sha256 === this.sha) {
      m.synced = true;
      const rate = isLocal(this.trainer.hp) ? `${msg.capacity.toFixed(2)} replica rounds/s` // a local-steps run's tasks are rounds
        : `${msg.capacity.toFixed(0)} micro-batches/s`;
      return [log(`${sender} is ready (${msg.kind}, ${rate})`), ...this._maybeBegin()];
    }
    if (msg.step > this.step && this.restoredTerm !== this.term) {
      // it holds a later step than we do: take its state once another member reports the same
      // (not after a restore: then the restored state is the run's)
      m.ahead = [msg.step, msg.params_sha256];
      m.aheadUntil = this.now + SYNC_WAIT_S;
      return this._ahead(sender);
    }
    m.synced = true; // by channel order the state arrives before the next assign / total
    return [log(`${sender} joins at step ${this.step}: sending the state`), send(sender, await this._state()), ...this._maybeBegin()];
  }

  _member(id) {
    if (!this.crew.has(id)) this.crew.set(id, new CrewMember(id));
    return this.crew.get(id);
  }

  /** The rollback window: the member's (one object; it goes on across terms, and across a
   * restore or a catch-up that loads a state it leads to: Window.rebase). */
  async _newWindow() {
    this.trust.useWindow(await this.member.windowFor());
  }

  _state() { return this.member.state(); }

  async onRefuse(sender, msg) {
    const m = this._member(sender);
    m.refused = true;
    m.ready = false;
    m.synced = false;
    return [refused(sender, msg.reasons), ...(await this._memberLeft(sender, true)),
      ...this._maybeBegin()];
  }

  async onContrib(sender, msg) {
    if (msg.term !== this.term || this.banned.has(sender)) return [];
    const size = this.trainer.totalSize;
    const bound = msg.micro.length * this.trainer.limit;
    const ints = msg.ints;
    if (!ints || ints.length !== size) {
      return this.trust.strike(sender, "refused", null, `refused a contribution from ${this._name(sender)}: not ${size} integers`);
    }
    const peak = pastBound(ints, bound);
    if (peak !== null) {
      return this.trust.strike(sender, "refused", null, `refused a contribution from ${this._name(sender)}: a value of magnitude ${peak} is over the clamp bound ${bound} of ${msg.micro.length} micro-batch(es)`);
    }
    const why = this.trainer.contributionError(ints, msg.micro, msg.step); // local steps: moments
    if (why) return this.trust.strike(sender, "refused", null, `refused a contribution from ${this._name(sender)}: ${why}`);
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
    if (this.stepStarted || this.catchingUp || this.ended) return [];
    if (this.step >= this.steps) return this._end();
    if (this.waitFor.size && this.now < this.waitUntil
        && [...this.waitFor].some((p) => this.room.has(p) && this.open.has(p) && !this._answered(p))) {
      return []; // give the members the run (or a restore) was announced to time to answer
    }
    this.waitFor = new Set();
    const live = this._live();
    if (live.length - 1 < this.waitPeers) return [];
    this.waitPeers = 0; // wait once, at the start
    return this.aggregation.begin(live);
  }

  _newTask(peer, micro, kind = "main") {
    const t = { task: this.nextTask, micro, assignees: [peer], sentAt: this.now,
      deadline: this.now + this._deadline(peer, micro.length), result: null, kind };
    this.nextTask += 1;
    this.tasks.set(t.task, t);
    return t;
  }

  /** coordinator.py _timed: whether `peer`'s seconds per micro-batch are known (it finished a
   * share after the term's first step), so that a late task of it is a miss, not noise. */
  _timed(peer) {
    if (this.excused.has(peer)) return true; // excused once already
    if (peer === this.me) return this.selfSpm !== null;
    const m = this.crew.get(peer);
    return m !== undefined && m.timed >= 1;
  }

  /** As run/coordinator.py _deadline: our own tasks follow our own timing once known. */
  _deadline(peer, n) {
    const timed = this.ownSpm !== null ? this.ownSpm : this.selfSpm;
    const own = timed !== null ? timed : 1.0 / Number(this.capacity || 1.0);
    const spm = peer === this.me ? own : this.crew.get(peer).secPerMicro;
    return Math.max(MIN_DEADLINE_S, DEADLINE_FACTOR * spm * n + 0.5);
  }

  /** Tell the members (each of its own tasks only) of new assignments (`peers`: task -> new assignee). */
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
        this.ownMicro.set(`${this.step}:${w.task}`, w.micro.length);
        out.push(compute(this.step, w.task, w.micro, this.trainer.theta.slice(), this.term));
      }
    }
    return out;
  }

  /** Members that follow the run (get assigns and totals). */
  _receivers() {
    return [...this.crew.values()].filter((m) => m.ready && m.synced && !m.refused && this.open.has(m.id) && !this.banned.has(m.id))
      .map((m) => m.id).sort();
  }

  /** Capacities, or shares that make everyone finish together (run/coordinator.py _split_weights). */
  _splitWeights(live, n) {
    const caps = live.map((p) => this._cap(p));
    const links = live.map((p, i) => (i === 0 ? this.selfFixed : this.crew.get(p).linkS));
    if (this.selfSpm === null || n < live.length || !links.some((x) => x > 0)) return caps;
    return finishShares(caps.map((c) => (this.selfSpm * caps[0]) / c), links, n);
  }

  /** As run/coordinator.py _time_task: once a peer's last task of the step is in, the coordinator's
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
      const busy = share.map((x) => x.busyS ?? null);
      let per = spent / n;
      if (busy.every((b) => b !== null)) { // the shell timed each compute: the rest is handling
        const sum = busy.reduce((a, b) => a + b, 0);
        per = sum / n;
        this.selfFixed = 0.5 * this.selfFixed + 0.5 * Math.max(0.0, spent - sum);
      }
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
      out.push(...(await this.trust.judge(t.micro[0])));
    }
    return [...out, ...(await this._maybeCommit())];
  }

  async _maybeCommit() {
    if (!this.stepStarted || !this.tasks.size) return [];
    if ([...this.tasks.values()].every((x) => x.kind !== "main" || x.result)
        && [...this.checks.values()].every((c) => c.decided)) return this._commit();
    return [];
  }

  async _commit() {
    const step = this.step;
    const { total, contributors, loss, unchecked } = Star.total(this.tasks.values(), this.checks, this.trainer.totalSize, this.me);
    await this.trainer.apply(total);
    const encoded = this.trust.window.encode(total); // once: the window's copy and every member's
    await this.trust.record(step, total, unchecked, encoded);
    const sha = await this._rehash();
    const receivers = this._receivers();
    this.stepStarted = false;
    this.tasks = new Map();
    this.checks = new Map();
    for (const k of [...this.pending.keys()]) if (Number(k.split(":")[0]) <= step) this.pending.delete(k);
    for (const k of [...this.ownMicro.keys()]) if (Number(k.split(":")[0]) < step) this.ownMicro.delete(k); // timed until the next commit
    const committed = this.member.committed(step, loss, contributors, sha);
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
    const marks = { unchecked: [...unchecked].sort(), removed: [...this.banned].sort() };
    const out = receivers.map((p) => send(p, withEncoded({ T: "total", term: this.term, step, contributors, loss,
      params_sha256: sha, ints: total, tasks: carried.get(p) ?? [], ...marks }, encoded)));
    return [...out, ...committed, ...next];
  }

  async _memberLeft(peer, quiet = false, force = false) {
    if (peer === this.me) return [];
    if (this.catchingUp && peer === this.catchFrom) {
      this.catchingUp = false;
      return [log(`${this._name(peer)} left before sending its state: going on from step ${this.step}`, true),
        ...(await this._memberLeft(peer, quiet, force)), ...this._maybeBegin()];
    }
    const m = this.crew.get(peer);
    if (m && (!m.refused || force)) this.crew.delete(peer);
    return this.aggregation.memberLeft(peer, m, quiet);
  }

  async _checkDeadlines() {
    if (!this.stepStarted) return [];
    const late = [];
    const added = new Map();
    const dropped = [];
    let timed = false; // a late task's peer whose timing is known (else it is no miss)
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
      timed = timed || t.assignees.some((p) => this._timed(p));
      // nobody else can give this second opinion: go without it (never a referee's: the answers
      // it settles differ, so it is waited for)
      if (!spare.length && t.kind === "check") {
        dropped.push(t);
        continue;
      }
      // a referee's task is the coordinator's own answer: no peer takes it over (two peers that
      // agree decide nothing, checks.js verdict), it is waited for
      if (!spare.length || t.kind === "referee") {
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
    if (!first && !timed) for (const t of [...late, ...dropped]) this.excused.add(t.assignees[0]);
    if (late.length) {
      out.push(log(`task(s) ${pyList(late.map((t) => t.task))} of step ${this.step} ` + (first
        ? "also given to a backup (the first step's timings are not known yet)"
        : !timed ? "also given to a backup (a first share: its peer's timing is not known yet)" : "missed the deadline: backup assigned")),
        ...this._dispatch(late, added));
    }
    if (dropped.length) {
      for (const t of dropped) this.tasks.delete(t.task);
      out.push(log(`spot-check(s) of micro-batch(es) ${pyList(dropped.map((t) => t.micro[0]))} of step ${this.step} ` +
        (first ? "skipped (the first step's timings are not known yet)"
          : !timed ? "skipped (a first share: its peer's timing is not known yet)" : "got no second answer in time: dropped")));
      for (const j of [...this.checks.keys()].sort((a, b) => a - b)) out.push(...(await this.trust.judge(j)));
      out.push(...(await this._maybeCommit()));
    }
    return out;
  }

  /** coordinator.py _late_end: a member's `ready` of this term came after the run ended: it
   * gets the final state, if it differs, and the end (it waited for ever before). */
  async _lateEnd(sender, msg) {
    const sha = this.sha;
    const out = [log(`${this._name(sender)} is ready after the run ended: sending the state and the end`)];
    if (msg.step !== this.step || msg.params_sha256 !== sha) out.push(send(sender, await this._state()));
    return [...out, send(sender, { T: "end", term: this.term, step: this.step, params_sha256: sha })];
  }

  _end() {
    this.ended = true;
    const msg = { T: "end", term: this.term, step: this.step, params_sha256: this.sha };
    // members still being brought in (ready, not synced: a catch-up was pending) get the
    // announce again: their ready then gets the final state and the end (_lateEnd)
    const late = [...this.crew.values()].filter((m) => m.ready && !m.synced && !m.refused && this.open.has(m.id) && !this.banned.has(m.id))
      .map((m) => m.id).sort();
    return [...this._receivers().map((p) => send(p, msg)), ...late.map((p) => send(p, this._announce())),
      ended(this.step, this.sha, true)];
  }
}

for (const role of [CatchUpRole]) {
  for (const name of Object.getOwnPropertyNames(role.prototype)) {
    if (name !== "constructor") Coordinator.prototype[name] = role.prototype[name];
  }
}

// the room and the run's settings: the driver's, read only (coordinator.py _of_peer)
for (const name of ["me", "now", "open", "room", "names", "capacity", "verifyRate", "strikes"]) {
  Object.defineProperty(Coordinator.prototype, name, { get() { return this.peer[name]; } });
}

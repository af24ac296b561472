// The ring aggregator (daisychain/peer/run/ring.py, rule for rule; docs/MESH.md "The ring"):
// a step's integer contributions summed by reduce-scatter + all-gather over the members' own
// data channels. Chunk c of a vector of `size` values is [c*size//n, (c+1)*size//n); member i
// sends to i+1: reduce-scatter rounds r = 0..n-2 send the partial sum of chunk (i-r) mod n
// and add chunk (i-1-r) mod n; all-gather rounds send chunk (i+1-r) mod n of the total and
// keep chunk (i-r) mod n. Every incoming chunk is checked (term, step, ring, sender = the
// ring predecessor, its place in the sequence, its chunk, its length, the clamp bound).
// Used only when the run checks nothing (verify rate 0) and every member's kind is in
// RING_KINDS. RingRole is mixed into RunPeer (driver.js);
// the roles' files call it through hooks marked "ring hook".

import { capacitySplit } from "./split.js";
import { g3, log, send } from "./util.js";

export const AGGREGATES = ["auto", "star", "ring"];
/** Member kinds (their ready) that take part in a ring: daisy-peer and the page's two. */
export const RING_KINDS = ["python", "cpu", "webgpu"];
/** Extra seconds a ring gets over its slowest member's task deadline. */
export const RING_SLACK_S = 2.0;
// the cost model (ring.py): a hop between two peer processes, one more member at the star's
// coordinator, seconds per wire byte, wire bytes per parameter (measured: docs/BENCHMARKS.md)
export const STAR_HOP_S = 7.7e-3;
export const RING_HOP_S = 5.3e-3;
export const MEMBER_S = 1.2e-3;
export const LINK_B_S_PER_BYTE = 55e-9;
export const BYTES_PER_VALUE = 1.5;

export function chunkBounds(size, n) {
  return Array.from({ length: n }, (_, c) => [Math.floor((c * size) / n), Math.floor(((c + 1) * size) / n)]);
}

export function starSeconds(n, micro, c, size, h = STAR_HOP_S, s = MEMBER_S, b = LINK_B_S_PER_BYTE) {
  const v = size * BYTES_PER_VALUE;
  return Math.ceil(micro / n) * c + 2 * h + (n - 1) * (s + 2 * v * b);
}

export function ringSeconds(n, micro, c, size, h = RING_HOP_S, b = LINK_B_S_PER_BYTE) {
  const v = size * BYTES_PER_VALUE;
  return Math.ceil(micro / n) * c + (2 * n - 1) * h + (2 * (n - 1) * b * v) / n;
}

/** [star | ring, why in words] for a step of n devices (ring.py choose). */
export function choose(aggregate, verifyRate, n, micro, c, size) {
  if (n < 2) return ["star", "1 device"];
  if (verifyRate > 0) return ["star", `${n} devices, spot-checks at rate ${g3(verifyRate)} (a ring would hide the contributions from them)`];
  if (aggregate === "ring") return ["ring", `${n} devices, no spot-checks (--aggregate ring)`];
  if (aggregate === "star") return ["star", `${n} devices (--aggregate star)`];
  const s = starSeconds(n, micro, c, size);
  const r = ringSeconds(n, micro, c, size);
  const model = `the cost model: star ${(s * 1e3).toFixed(2)} ms, ring ${(r * 1e3).toFixed(2)} ms a step`;
  if (r < s) return ["ring", `${n} devices, no spot-checks; ${model}`];
  return ["star", `${n} devices; ${model}`];
}

export class RingError extends Error {}

/** One replica's part in one ring (one step, one ring number): plain state, no I/O. */
export class Ring {
  constructor(term, step, ring, peers, me, size, bound) {
    Object.assign(this, { term, step, ring, bound });
    this.peers = [...peers];
    this.n = this.peers.length;
    this.i = this.peers.indexOf(me);
    this.prev = this.peers[(this.i - 1 + this.n) % this.n];
    this.next = this.peers[(this.i + 1) % this.n];
    this.bounds = chunkBounds(size, this.n);
    this.acc = null;   // own contribution, then partial sums, then the total
    this.queue = [];   // checked chunks that came before our contribution
    this.seen = 0;     // chunks taken or queued
    this.total = null;
  }

  _send(phase, round, c) {
    const [lo, hi] = this.bounds[c];
    return { T: "ring_chunk", term: this.term, step: this.step, ring: this.ring, phase, round, chunk: c,
      ints: this.acc.slice(lo, hi) };
  }

  contribute(ints) {
    this.acc = Float64Array.from(ints);
    const out = [this._send(0, 0, this.i)];
    for (const msg of this.queue) out.push(...this._take(msg));
    this.queue = [];
    return out;
  }

  receive(sender, msg) {
    if (msg.term !== this.term || msg.step !== this.step || msg.ring !== this.ring) {
      throw new RingError(`it is of term ${msg.term}, step ${msg.step}, ring ${msg.ring}; the ring is term ${this.term}, step ${this.step}, ring ${this.ring}`);
    }
    if (sender !== this.prev) throw new RingError(`it comes from ${sender}, not from the ring predecessor ${this.prev}`);
    const last = this.n - 1;
    if (this.seen >= 2 * last) throw new RingError("the ring already has all its chunks");
    const wantPhase = Math.floor(this.seen / last);
    const wantRound = this.seen % last;
    if (msg.phase !== wantPhase || msg.round !== wantRound) {
      throw new RingError(`it is phase ${msg.phase} round ${msg.round}; phase ${wantPhase} round ${wantRound} is due`);
    }
    const want = msg.phase === 0 ? (((this.i - 1 - msg.round) % this.n) + this.n) % this.n
      : (((this.i - msg.round) % this.n) + this.n) % this.n;
    if (msg.chunk !== want) throw new RingError(`it is chunk ${msg.chunk}; this ring position takes chunk ${want}`);
    const [lo, hi] = this.bounds[want];
    if (msg.ints.length !== hi - lo) throw new RingError(`it holds ${msg.ints.length} values; chunk ${want} has ${hi - lo}`);
    let peak = 0;
    for (const v of msg.ints) peak = Math.max(peak, Math.abs(v));
    if (peak > this.bound) throw new RingError(`a value of magnitude ${peak} is over the step's clamp bound ${this.bound}`);
    this.seen += 1;
    if (this.acc === null) {
      this.queue.push(msg);
      return [];
    }
    return this._take(msg);
  }

  _take(msg) {
    const [lo] = this.bounds[msg.chunk];
    const last = msg.round === this.n - 2;
    if (msg.phase === 0) {
      for (let k = 0; k < msg.ints.length; k++) this.acc[lo + k] += msg.ints[k];
      return [last ? this._send(1, 0, msg.chunk) : this._send(0, msg.round + 1, msg.chunk)];
    }
    this.acc.set(msg.ints, lo);
    if (last) {
      this.total = this.acc;
      return [];
    }
    return [this._send(1, msg.round + 1, msg.chunk)];
  }
}

const planFor = (plan, peer) => ({ T: "ring_plan", term: plan.term, step: plan.step, ring: plan.ring,
  peers: plan.peers, tasks: plan.tasks.filter((t) => t.peer === peer) });
const same = (a, b) => a.term === b.term && a.step === b.step && a.ring === b.ring;

export class RingRole {
  _ringInit(aggregate) {
    if (!AGGREGATES.includes(aggregate)) throw new RangeError(`the aggregation must be one of ${AGGREGATES.join(", ")}`);
    if (aggregate === "ring" && this.verifyRate > 0) {
      throw new RangeError("--aggregate ring needs --verify-rate 0: a ring hides each contribution from the spot-checks");
    }
    this.aggregate = aggregate;
    this.ringSaid = null;
    this.ringCount = 0;
    this.ringStarStep = -1;
    this.ringDeadline = 0;
    this.ringEarly = new Map(); // "term:step:ring" -> [[sender, chunk], ...]
    this.ringSums = new Map();
    this.ringPlan = null;
    this._ringDrop();
  }

  /** ring hook (a new term, a restore, a catch-up): rings under way are dropped. */
  _ringDrop() {
    if (this.ringPlan) for (const t of this.ringPlan.tasks) this.pending.delete(`${this.ringPlan.step}:${t.task}`);
    this.ring = null;
    this.ringPlan = null;
    this.ringSums = new Map();
    this.ringCommit = null;
    this.ringNext = null;
    this.ringEnd = null;
  }

  /** ring hook (computed): is this compute this replica's share of its ring? */
  _ringOwns(step, task) {
    return this.ring !== null && this.ring.step === step && this.ringPlan.tasks.some((t) => t.task === task && t.peer === this.me);
  }

  /** Take part in `plan`; returns [outputs, the chunks that waited for it]. */
  _ringNew(plan) {
    const nxt = this.ringNext;
    this._ringDrop();
    this.ringNext = nxt && nxt.step > plan.step ? nxt : null;
    this.ringPlan = plan;
    const tr = this.trainer;
    const size = tr.layout.size;
    const nMicro = tr.hp.batch / tr.hp.micro_batch;
    this.ring = new Ring(plan.term, plan.step, plan.ring, plan.peers, this.me, size, nMicro * tr.limit);
    const out = [];
    const mine = plan.tasks.filter((t) => t.peer === this.me);
    for (const t of mine) {
      this.pending.set(`${plan.step}:${t.task}`, t.micro);
      out.push({ kind: "compute", step: plan.step, task: t.task, micro: t.micro, theta: tr.theta.slice() });
    }
    if (!mine.length) out.push(...this._ringSends(this.ring.contribute(new Float64Array(size))));
    const key = `${plan.term}:${plan.step}:${plan.ring}`;
    const early = this.ringEarly.get(key) || [];
    this.ringEarly.delete(key);
    return [out, early];
  }

  async _ringStart(plan) {
    const [out, early] = this._ringNew(plan);
    for (const [sender, msg] of early) out.push(...(await this._onRingChunk(sender, msg)));
    return out;
  }

  _ringSends(chunks) { return chunks.map((c) => send(this.ring.next, c)); }

  /** ring hook (computed): this replica's share of its ring is computed. */
  async _ringComputed(step, task, grad, loss, correct) {
    const micro = this.ringPlan.tasks.find((t) => t.task === task).micro;
    const out = this._ringSends(this.ring.contribute(grad));
    if (this.coordinating) {
      this.ringSums.set(this.me, [task, micro, loss, correct]);
      return [...out, ...(await this._ringMaybeCommit())];
    }
    return [send(this.coord, { T: "ring_sum", term: this.term, step, ring: this.ring.ring, micro, loss, correct }), ...out];
  }

  // -- every replica: chunks ------------------------------------------------------------------

  async _onRingChunk(sender, msg) {
    if (!this.trainer || msg.term < this.term || msg.step < this.step) return [];
    const r = this.ring;
    if (r && msg.term === r.term && msg.step === r.step && msg.ring < r.ring) return []; // an abandoned ring's
    if (!r || !same(msg, r)) return this._ringKeep(sender, msg);
    let chunks;
    try {
      chunks = r.receive(sender, msg);
    } catch (err) {
      if (!(err instanceof RingError)) throw err;
      const text = `refused a ring chunk from ${this._name(sender)}: ${err.message}`;
      if (this.coordinating && this.crew.has(sender) && !this.banned.has(sender)) return this._strike(sender, "refused", null, text);
      return [log(text, true)];
    }
    const out = this._ringSends(chunks);
    if (r.total === null) return out;
    return [...out, ...(this.coordinating ? await this._ringMaybeCommit() : await this._ringMaybeApply())];
  }

  /** A chunk of a ring this replica has no plan of yet: kept, at most two rings. */
  _ringKeep(sender, msg) {
    const size = this.trainer.layout.size;
    const key = `${msg.term}:${msg.step}:${msg.ring}`;
    for (const k of [...this.ringEarly.keys()]) {
      const [term, step] = k.split(":").map(Number);
      if (step < this.step || term < this.term || (term === this.term && step < this.step)) this.ringEarly.delete(k);
    }
    if (msg.step > this.step + 1 || (!this.ringEarly.has(key) && this.ringEarly.size >= 2)) {
      return [log(`refused a ring chunk from ${this._name(sender)}: step ${msg.step} ring ${msg.ring} is not planned here (step ${this.step})`, true)];
    }
    if (!this.ringEarly.has(key)) this.ringEarly.set(key, []);
    const kept = this.ringEarly.get(key);
    const limit = 2 * (Math.max(this.room.size, 2) - 1);
    if (kept.length >= limit || msg.ints.length > Math.floor(size / 2) + 1) {
      return [log(`refused a ring chunk from ${this._name(sender)}: more or larger chunks than a ring of step ${msg.step} has`, true)];
    }
    kept.push([sender, msg]);
    return [];
  }

  // -- member ---------------------------------------------------------------------------------

  async _onRingPlan(sender, msg) {
    if (this.coordinating || sender !== this.coord || msg.term !== this.term || !this.trainer || !msg.peers.includes(this.me)) return [];
    if (msg.step === this.step + 1) {
      this.ringNext = msg; // our ring of this step is still gathering
      return [];
    }
    if (msg.step !== this.step || (this.ringPlan && this.ringPlan.step === msg.step && this.ringPlan.ring === msg.ring)) return [];
    return this._ringStart(msg);
  }

  async _onRingSum(sender, msg) {
    const plan = this.ringPlan;
    if (!this.coordinating || !plan || !this.ring || msg.term !== this.term || msg.step !== plan.step || msg.ring !== plan.ring) return [];
    const task = plan.tasks.find((t) => t.peer === sender);
    if (!task || task.micro.length !== msg.micro.length || task.micro.some((j, k) => j !== msg.micro[k]) || this.ringSums.has(sender)) return [];
    this.ringSums.set(sender, [task.task, msg.micro, msg.loss, msg.correct]);
    return this._ringMaybeCommit();
  }

  async _onRingCommit(sender, msg) {
    if (this.coordinating || sender !== this.coord || msg.term !== this.term || !this.trainer || msg.step < this.step) return [];
    const plan = this.ringPlan;
    if (msg.step > this.step || !plan || plan.step !== msg.step || plan.ring !== msg.ring) {
      return [log(`missed step ${this.step}'s ring: resyncing`, true),
        send(sender, { T: "sync", term: this.term, step: this.step, params_sha256: this.sha, reason: "behind" })];
    }
    this.ringCommit = msg;
    const out = await this._ringMaybeApply();
    return out.length ? out : this._ringStuck();
  }

  async _ringMaybeApply() {
    const r = this.ring;
    const c = this.ringCommit;
    if (!r || !c || r.total === null || r.step !== this.step) return [];
    const total = r.total;
    this.ring = null;
    const out = await this._apply(total, c.loss, c.contributors, c.params_sha256, this.coord);
    const nxt = this.ringNext;
    this.ringNext = null;
    if (nxt && nxt.step === this.step && this.sha === c.params_sha256) out.push(...(await this._ringStart(nxt)));
    return [...out, ...(await this._ringEnded())];
  }

  /** ring hook (member _onEnd): the run's end overtook the last total this replica's ring is
   * still gathering: the end waits for it. */
  _ringHoldsEnd(msg) {
    const r = this.ring;
    if (!r || r.total !== null || r.step !== this.step || !this.ringCommit) return false;
    this.ringEnd = msg;
    return true;
  }

  async _ringEnded() {
    const end = this.ringEnd;
    this.ringEnd = null;
    return end ? this._onEnd(this.coord, end) : [];
  }

  /** ring hook (member: a channel closed, the room changed, a commit came): the coordinator
   * committed our ring's step but a ring peer is gone before our part of the total came. */
  _ringStuck() {
    const r = this.ring;
    if (this.coordinating || !r || r.total !== null || !this.ringCommit || r.step !== this.step
        || r.peers.every((p) => p === this.me || (this.open.has(p) && this.room.has(p)))) return [];
    this.ring = null;
    this.ringCommit = null;
    return [log(`a member left while step ${this.step}'s ring was gathering: resyncing`),
      send(this.coord, { T: "sync", term: this.term, step: this.step, params_sha256: this.sha, reason: "ring broken" })];
  }

  /** ring hook (member _onState): a state was loaded; a held plan of its step starts. */
  async _ringSynced() {
    this.ring = null;
    this.ringCommit = null;
    const nxt = this.ringNext;
    this.ringNext = null;
    if (nxt && nxt.step === this.step && nxt.term === this.term) return this._ringStart(nxt);
    return this._ringEnded();
  }

  // -- coordinator ----------------------------------------------------------------------------

  /** ring hook (coordinator _beginStep): [sum this step by a ring?, log lines]. */
  _ringChoice(live) {
    if (this.aggregate === "star") return [false, []];
    const tr = this.trainer;
    const c = this.selfSpm !== null ? this.selfSpm : 1.0 / Number(this.capacity || 1.0);
    let [mode, why] = choose(this.aggregate, this.verifyRate, live.length, tr.hp.batch / tr.hp.micro_batch, c, tr.layout.size);
    const odd = live.slice(1).filter((p) => this.crew.has(p)).map((p) => this.crew.get(p).kind).filter((k) => !RING_KINDS.includes(k));
    if (mode === "ring" && odd.length) {
      mode = "star";
      why = `${live.length} devices, one of kind ${odd[0]} among them (it has no ring)`;
    }
    if (this.ringStarStep === this.step) {
      mode = "star";
      why = `${live.length} devices, this step's ring missed its deadline`;
    }
    const out = [];
    if (!this.ringSaid || this.ringSaid[0] !== mode || this.ringSaid[1] !== live.length) {
      this.ringSaid = [mode, live.length];
      out.push(log(`aggregating by ${mode}: ${why}`));
    }
    return [mode === "ring", out];
  }

  /** One task per member with micro-batches (none: it adds zeros); each member gets the plan. */
  _ringBegin(live) {
    this.stepStarted = true;
    this.tasks = new Map();
    this.checks = new Map();
    const n = this.trainer.hp.batch / this.trainer.hp.micro_batch;
    const ids = Array.from({ length: n }, (_, j) => j);
    const parts = capacitySplit(ids, this._splitWeights(live, n));
    const tasks = [];
    live.forEach((peer, i) => {
      if (parts[i].length) tasks.push({ task: this.nextTask++, peer, micro: parts[i] });
    });
    this.ringCount += 1;
    const plan = { T: "ring_plan", term: this.term, step: this.step, ring: this.ringCount, peers: [...live], tasks };
    this.ringDeadline = this.now + RING_SLACK_S + Math.max(...tasks.map((t) => this._deadline(t.peer, t.micro.length)));
    const out = live.slice(1).map((p) => send(p, planFor(plan, p)));
    const [mine] = this._ringNew(plan); // nothing can wait for a ring the coordinator just made
    return [...out, ...mine];
  }

  async _ringMaybeCommit() {
    const r = this.ring;
    const plan = this.ringPlan;
    if (!r || r.total === null || r.step !== this.step || plan.tasks.some((t) => !this.ringSums.has(t.peer))) return [];
    const step = this.step;
    const total = r.total;
    const sums = [...this.ringSums.entries()].sort((a, b) => a[1][0] - b[1][0]); // task order, as the star
    const contributors = sums.map(([p, s]) => [p, s[1].length]).sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    let lossSum = 0;
    let n = 0;
    for (const [, s] of sums) {
      lossSum += s[2];
      n += s[1].length;
    }
    const loss = lossSum / Math.max(n, 1);
    await this.trainer.apply(total);
    const unchecked = new Set(contributors.map(([p]) => p).filter((p) => p !== this.me));
    await this.window.record(this.trainer, step, total, unchecked);
    for (const p of unchecked) if (!this.uncheckedSince.has(p)) this.uncheckedSince.set(p, step);
    const sha = await this._rehash();
    this.ring = null;
    this.stepStarted = false;
    for (const k of [...this.pending.keys()]) if (Number(k.split(":")[0]) <= step) this.pending.delete(k);
    const out = [];
    for (const p of this._receivers()) { // a ring member gets the commit; anyone else the total
      if (plan.peers.includes(p)) out.push(send(p, { T: "ring_commit", term: this.term, step, ring: plan.ring, contributors, loss, params_sha256: sha }));
      else out.push(send(p, { T: "total", term: this.term, step, contributors, loss, params_sha256: sha, ints: total, tasks: [] }));
    }
    return [...out, ...this._committed(step, loss, contributors, sha), ...this._maybeBegin()];
  }

  /** ring hook (coordinator _memberLeft): a ring member left before the commit: abandon the
   * ring, do the step again with those still here. null: not a ring matter. */
  _ringMemberLeft(peer) {
    const r = this.ring;
    if (!this.coordinating || !r || !r.peers.includes(peer)) return null;
    this._ringDrop();
    this.stepStarted = false;
    return [log(`${this._name(peer)} left during step ${this.step}: its ring is abandoned, the step is done again by the others`),
      ...this._maybeBegin()];
  }

  /** ring hook (tick): a ring not gathered by its deadline is abandoned; the step is done
   * again by the star. */
  _ringCheckDeadline() {
    const r = this.ring;
    if (!this.coordinating || !r || r.total !== null || this.now < this.ringDeadline) return [];
    this._ringDrop();
    this.stepStarted = false;
    this.ringStarStep = this.step;
    return [log(`the ring of step ${this.step} missed its deadline: the step is done again by the star`, true), ...this._maybeBegin()];
  }

  /** ring hook (coordinator _onSync): a ring member that asked for the state gets the plan
   * of the step under way after it. */
  _ringResend(peer) {
    const plan = this.ringPlan;
    if (!this.coordinating || !this.ring || !plan || !plan.peers.includes(peer)) return [];
    return [send(peer, planFor(plan, peer))];
  }
}

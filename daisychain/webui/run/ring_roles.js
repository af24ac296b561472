// The ring's two sides in the run protocol (daisychain/peer/run/ring_roles.py, rule for rule;
// the ring itself: ring.js), behind the aggregation interfaces of aggregator.js; each holds a
// star for the steps the ring does not sum.
// - RingMember, the Member's aggregation: a member's ring state (the plan, its Ring,
//   chunks that came early, the commit, the next step's plan, an end that overtook the last
//   chunk), applying the total on the commit, asking for the state when its ring broke.
// - RingCoordinator, the Coordinator's aggregation: the choice star / ring, the
//   plan, the sums, the commit, a ring member that left, a ring that missed its deadline (the
//   step again by the star); the coordinator's own replica takes part through it.
// The driver routes ring_plan / ring_commit to the member's side, ring_sum to the
// coordinator's and ring_chunk to the side of the role that speaks for the replica (onMessage). A
// coordinator built at a hand-over starts with no ring; stepping down drops it.

import { Aggregation, MemberAggregation, StarMember } from "./aggregator.js";
import { RING_KINDS, RING_SLACK_S, Ring, RingError, choose, ringSize } from "./ring.js";
import { capacitySplit } from "./split.js";
import { log, send } from "./util.js";
import { compute } from "./outputs.js";

const planFor = (plan, peer) => ({ T: "ring_plan", term: plan.term, step: plan.step, ring: plan.ring,
  peers: plan.peers, tasks: plan.tasks.filter((t) => t.peer === peer) });
const same = (a, b) => a.term === b.term && a.step === b.step && a.ring === b.ring;
/** A ring message's handler (onMessage). */
const HANDLERS = { ring_plan: "onRingPlan", ring_commit: "onRingCommit", ring_sum: "onRingSum", ring_chunk: "onRingChunk" };

/** This replica's ring under `role` (a Member or a Coordinator: its peer, trainer, term,
 * step, pending), over the aggregation interface `Base`. */
const RingPart = (Base) => class extends Base {
  constructor(role) {
    super();
    this.role = role;
    this.peer = role.peer;
    this.early = new Map(); // "term:step:ring" -> [[sender, chunk], ...] of rings not planned yet
    this.ring = null;
    this.plan = null;
    this.drop();
  }

  /** Rings under way are dropped (a new term, a restore, a catch-up, a broken ring). */
  drop() {
    if (this.plan) for (const t of this.plan.tasks) this.role.pending.delete(`${this.plan.step}:${t.task}`);
    this.ring = null;
    this.plan = null;
  }

  /** Is this compute this replica's share of its ring? */
  _owns(step, task) {
    return this.ring !== null && this.ring.step === step && this.plan.tasks.some((t) => t.task === task && t.peer === this.peer.me);
  }

  /** Take part in `plan`; returns [outputs, the chunks that waited for it]. */
  _new(plan) {
    this.drop(); // an abandoned ring's work is not wanted any more
    this.plan = plan;
    const tr = this.role.trainer;
    const me = this.peer.me;
    const size = ringSize(tr, plan.step); // a local round between anchors: its deltas alone
    this.ring = new Ring(plan.term, plan.step, plan.ring, plan.peers, me, size, tr.nTasks * tr.limit, tr.totalSize);
    const out = [];
    const mine = plan.tasks.filter((t) => t.peer === me);
    for (const t of mine) {
      this.role.pending.set(`${plan.step}:${t.task}`, t.micro);
      out.push(compute(plan.step, t.task, t.micro, tr.theta.slice(), this.role.term));
    }
    if (!mine.length) out.push(...this._sends(this.ring.contribute(new Float64Array(size))));
    const key = `${plan.term}:${plan.step}:${plan.ring}`;
    const early = this.early.get(key) || [];
    this.early.delete(key);
    return [out, early];
  }

  async _start(plan) {
    const [out, early] = this._new(plan);
    for (const [sender, msg] of early) out.push(...(await this.onRingChunk(sender, msg)));
    return out;
  }

  _sends(chunks) { return chunks.map((c) => send(this.ring.next, c)); }

  /** ring_plan / ring_commit / ring_sum / ring_chunk: its handler here. */
  async onMessage(sender, msg) { return this[HANDLERS[msg.T]](sender, msg); }

  async onRingChunk(sender, msg) {
    const role = this.role;
    if (!role.trainer || msg.term < role.term || msg.step < role.step) return [];
    const r = this.ring;
    if (r && msg.term === r.term && msg.step === r.step && msg.ring < r.ring) return []; // an abandoned ring's
    if (!r || !same(msg, r)) return this._keep(sender, msg);
    let chunks;
    try {
      chunks = r.receive(sender, msg);
    } catch (err) {
      if (!(err instanceof RingError)) throw err;
      return this._refused(sender, `refused a ring chunk from ${this.peer._name(sender)}: ${err.message}`);
    }
    const out = this._sends(chunks);
    if (r.total === null) return out;
    return [...out, ...(await this._gathered())];
  }

  async _refused(sender, text) { return [log(text, true)]; }

  /** A chunk of a ring this replica has no plan of yet: kept, at most two rings. */
  _keep(sender, msg) {
    const role = this.role;
    const name = this.peer._name(sender);
    const size = ringSize(role.trainer, msg.step);
    const key = `${msg.term}:${msg.step}:${msg.ring}`;
    for (const k of [...this.early.keys()]) {
      const [term, step] = k.split(":").map(Number);
      if (step < role.step || term < role.term) this.early.delete(k);
    }
    if (msg.step > role.step + 1 || (!this.early.has(key) && this.early.size >= 2)) {
      return [log(`refused a ring chunk from ${name}: step ${msg.step} ring ${msg.ring} is not planned here (step ${role.step})`, true)];
    }
    if (!this.early.has(key)) this.early.set(key, []);
    const kept = this.early.get(key);
    const limit = 2 * (Math.max(this.peer.room.size, 2) - 1);
    if (kept.length >= limit || msg.ints.length > Math.floor(size / 2) + 1) {
      return [log(`refused a ring chunk from ${name}: more or larger chunks than a ring of step ${msg.step} has`, true)];
    }
    kept.push([sender, msg]);
    return [];
  }
};

/** A member's ring (member.aggregation): commit (the commit of its ring), next (the plan of
 * the step after, while its ring still gathers), end (an end that overtook its last chunk);
 * star: a share outside a ring goes to the coordinator. */
export class RingMember extends RingPart(MemberAggregation) {
  constructor(member) {
    super(member);
    this.star = new StarMember(member);
  }

  drop() {
    super.drop();
    this.commit = null;
    this.next = null;
    this.end = null;
  }

  _new(plan) {
    const nxt = this.next;
    const res = super._new(plan);
    this.next = nxt && nxt.step > plan.step ? nxt : null;
    return res;
  }

  /** A share of this replica's ring: into the ring, its sum to the coordinator; any other
   * share: the star's. */
  async computed(step, task, micro, grad, loss, correct) {
    if (!this._owns(step, task)) return this.star.computed(step, task, micro, grad, loss, correct);
    const m = this.role;
    micro = this.plan.tasks.find((t) => t.task === task).micro;
    const out = this._sends(this.ring.contribute(grad));
    return [send(m.coord, { T: "ring_sum", term: m.term, step, ring: this.ring.ring, micro, loss, correct }), ...out];
  }

  async _gathered() { return this._maybeApply(); }

  async onRingPlan(sender, msg) {
    const m = this.role;
    if (sender !== m.coord || msg.term !== m.term || !m.trainer || !msg.peers.includes(this.peer.me)) return [];
    if (msg.step === m.step + 1) {
      this.next = msg; // our ring of this step is still gathering
      return [];
    }
    if (msg.step !== m.step || (this.plan && this.plan.step === msg.step && this.plan.ring === msg.ring)) return [];
    return this._start(msg);
  }

  async onRingCommit(sender, msg) {
    const m = this.role;
    if (sender !== m.coord || msg.term !== m.term || !m.trainer || msg.step < m.step) return [];
    const plan = this.plan;
    if (msg.step > m.step || !plan || plan.step !== msg.step || plan.ring !== msg.ring) {
      return [log(`missed step ${m.step}'s ring: resyncing`, true),
        send(sender, { T: "sync", term: m.term, step: m.step, params_sha256: m.sha, reason: "behind" })];
    }
    this.commit = msg;
    const out = await this._maybeApply();
    return out.length ? out : this.peersChanged();
  }

  async _maybeApply() {
    const m = this.role;
    const r = this.ring;
    const c = this.commit;
    if (!r || !c || r.total === null || r.step !== m.step) return [];
    const total = r.total;
    this.ring = null;
    const out = await m._apply(total, c.loss, c.contributors, c.params_sha256, m.coord);
    const nxt = this.next;
    this.next = null;
    if (nxt && nxt.step === m.step && m.sha === c.params_sha256) out.push(...(await this._start(nxt)));
    return [...out, ...(await this._ended())];
  }

  /** The run's end overtook the last total this replica's ring is
   * still gathering: the end waits for it. */
  holdsEnd(msg) {
    const r = this.ring;
    if (!r || r.total !== null || r.step !== this.role.step || !this.commit) return false;
    this.end = msg;
    return true;
  }

  async _ended() {
    const end = this.end;
    this.end = null;
    return end ? this.role.onEnd(this.role.coord, end) : [];
  }

  /** A channel closed, the room changed, or a commit came: when the coordinator committed
   * our ring's step but a ring peer is gone before our part of the total came, ask for the
   * state. */
  peersChanged() {
    const m = this.role;
    const r = this.ring;
    const p = this.peer;
    if (!r || r.total !== null || !this.commit || r.step !== m.step
        || r.peers.every((q) => q === p.me || (p.open.has(q) && p.room.has(q)))) return [];
    this.ring = null;
    this.commit = null;
    return [log(`a member left while step ${m.step}'s ring was gathering: resyncing`),
      send(m.coord, { T: "sync", term: m.term, step: m.step, params_sha256: m.sha, reason: "ring broken" })];
  }

  /** A state was loaded; a held plan of its step starts. */
  async synced() {
    this.ring = null;
    this.commit = null;
    const nxt = this.next;
    this.next = null;
    if (nxt && nxt.step === this.role.step && nxt.term === this.role.term) return this._start(nxt);
    return this._ended();
  }
}

/** The coordinator's ring (coordinator.aggregation): said (the last choice logged), count
 * (ring numbers of this term), starStep (a step redone by the star), until (the ring's
 * deadline), sums (peer -> [task, micro, loss, correct]); star: the steps the ring does not
 * sum. */
export class RingCoordinator extends RingPart(Aggregation) {
  constructor(coordinator, star) {
    super(coordinator);
    this.star = star;
    this.said = null;
    this.count = 0;
    this.starStep = -1;
    this.until = 0;
  }

  drop() {
    super.drop();
    this.sums = new Map();
  }

  async _refused(sender, text) {
    const c = this.role;
    if (c.crew.has(sender) && !c.banned.has(sender)) return c.trust.strike(sender, "refused", null, text);
    return [log(text, true)];
  }

  async _gathered() { return this._maybeCommit(); }

  /** The step by a ring or by the star (_choice). */
  begin(live) {
    const [ring, said] = this._choice(live);
    return [...said, ...(ring ? this._begin(live) : this.star.begin(live))];
  }

  /** [sum this step by a ring?, log lines]: said when the choice or the number of devices
   * changes. */
  _choice(live) {
    const c = this.role;
    const p = this.peer;
    if (p.aggregate === "star") return [false, []];
    const tr = c.trainer;
    const spm = c.selfSpm !== null ? c.selfSpm : 1.0 / Number(c.capacity || 1.0);
    const local = tr.totalSize !== tr.layout.size;
    const anchor = local && tr.isAnchor(c.step);
    let [mode, why] = choose(p.aggregate, c.verifyRate, live.length, tr.nTasks, spm, ringSize(tr, c.step),
      local, anchor);
    const odd = live.slice(1).filter((q) => c.crew.has(q)).map((q) => c.crew.get(q).kind).filter((k) => !RING_KINDS.includes(k));
    if (mode === "ring" && odd.length) {
      mode = "star";
      why = `${live.length} devices, one of kind ${odd[0]} among them (it has no ring)`;
    }
    if (this.starStep === c.step) {
      mode = "star";
      why = `${live.length} devices, this step's ring missed its deadline`;
    }
    const out = [];
    if (anchor && mode === "star" && this.said) return [false, out]; // said once, with the ring's reason
    if (!this.said || this.said[0] !== mode || this.said[1] !== live.length) {
      this.said = [mode, live.length];
      out.push(log(`aggregating by ${mode}: ${why}`));
    }
    return [mode === "ring", out];
  }

  /** One task per member with micro-batches (none: it adds zeros); each member gets the plan. */
  _begin(live) {
    const c = this.role;
    c.stepStarted = true;
    c.tasks = new Map();
    c.checks = new Map();
    const n = c.trainer.nTasks;
    const ids = Array.from({ length: n }, (_, j) => j);
    const parts = capacitySplit(ids, c._splitWeights(live, n));
    const tasks = [];
    live.forEach((peer, i) => {
      if (parts[i].length) tasks.push({ task: c.nextTask++, peer, micro: parts[i] });
    });
    this.count += 1;
    const plan = { T: "ring_plan", term: c.term, step: c.step, ring: this.count, peers: [...live], tasks };
    this.until = c.now + RING_SLACK_S + Math.max(...tasks.map((t) => c._deadline(t.peer, t.micro.length)));
    const out = live.slice(1).map((q) => send(q, planFor(plan, q)));
    const [mine] = this._new(plan); // nothing can wait for a ring the coordinator just made
    return [...out, ...mine];
  }

  /** Our own share of the ring; any other share: the star's. */
  async computed(step, task, micro, grad, loss, correct) {
    if (!this._owns(step, task)) return this.star.computed(step, task, micro, grad, loss, correct);
    micro = this.plan.tasks.find((t) => t.task === task).micro;
    const out = this._sends(this.ring.contribute(grad));
    this.sums.set(this.peer.me, [task, micro, loss, correct]);
    return [...out, ...(await this._maybeCommit())];
  }

  async onRingSum(sender, msg) {
    const c = this.role;
    const plan = this.plan;
    if (!plan || !this.ring || msg.term !== c.term || msg.step !== plan.step || msg.ring !== plan.ring) return [];
    const task = plan.tasks.find((t) => t.peer === sender);
    if (!task || task.micro.length !== msg.micro.length || task.micro.some((j, k) => j !== msg.micro[k]) || this.sums.has(sender)) return [];
    this.sums.set(sender, [task.task, msg.micro, msg.loss, msg.correct]);
    return this._maybeCommit();
  }

  async _maybeCommit() {
    const c = this.role;
    const r = this.ring;
    const plan = this.plan;
    if (!r || r.total === null || r.step !== c.step || plan.tasks.some((t) => !this.sums.has(t.peer))) return [];
    const step = c.step;
    const total = r.total;
    const sums = [...this.sums.entries()].sort((a, b) => a[1][0] - b[1][0]); // task order, as the star
    const contributors = sums.map(([p, s]) => [p, s[1].length]).sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    let lossSum = 0;
    let n = 0;
    for (const [, s] of sums) {
      lossSum += s[2];
      n += s[1].length;
    }
    const loss = lossSum / Math.max(n, 1);
    await c.trainer.apply(total);
    const unchecked = new Set(contributors.map(([p]) => p).filter((p) => p !== c.me));
    await c.trust.record(step, total, unchecked);
    const sha = await c._rehash();
    this.ring = null;
    c.stepStarted = false;
    for (const k of [...c.pending.keys()]) if (Number(k.split(":")[0]) <= step) c.pending.delete(k);
    const out = [];
    for (const p of c._receivers()) { // a ring member gets the commit; anyone else the total
      if (plan.peers.includes(p)) out.push(send(p, { T: "ring_commit", term: c.term, step, ring: plan.ring, contributors, loss, params_sha256: sha }));
      else out.push(send(p, { T: "total", term: c.term, step, contributors, loss, params_sha256: sha, ints: total, tasks: [] }));
    }
    return [...out, ...c.member.committed(step, loss, contributors, sha), ...c._maybeBegin()];
  }

  /** A ring member left before the commit: abandon the ring, do the step again with those
   * still here. Anyone else: the star's. */
  async memberLeft(peer, gone, quiet) {
    const c = this.role;
    const r = this.ring;
    if (!r || !r.peers.includes(peer)) return this.star.memberLeft(peer, gone, quiet);
    this.drop();
    c.stepStarted = false;
    return [log(`${this.peer._name(peer)} left during step ${c.step}: its ring is abandoned, the step is done again by the others`),
      ...c._maybeBegin()];
  }

  /** The star's tasks past their deadline; a ring not gathered by its deadline is abandoned,
   * the step is done again by the star. */
  async deadline() {
    const out = await this.star.deadline();
    const c = this.role;
    const r = this.ring;
    if (!r || r.total !== null || c.now < this.until) return out;
    this.drop();
    c.stepStarted = false;
    this.starStep = c.step;
    return [...out, log(`the ring of step ${c.step} missed its deadline: the step is done again by the star`, true), ...c._maybeBegin()];
  }

  /** A ring member that asked for the state gets the plan of the step under way after it. */
  resend(peer) {
    const plan = this.plan;
    if (!this.ring || !plan || !plan.peers.includes(peer)) return [];
    return [send(peer, planFor(plan, peer))];
  }
}

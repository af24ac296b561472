// The tab's part in a run: its self-test, and the run protocol of docs/MESH.md spoken over
// the data channels of network.js, every byte through frames.js (docs/MESH.md). No DOM: what happens is
// reported on the bus (bus.js lists the events: run:*, counters, room:peers), devices named
// by their room names.
//
//   const device = await selfTestDevice();            // {kind, reason, capacity, units, ...}
//   const mesh = new Mesh(bus, net, device);          // follows the room's coordinator
//   await mesh.start(settings);                       // the host: announce and coordinate
//
// The run logic itself is the sans-I/O RunPeer of webui/run/ (the twin of
// daisychain/peer/run/); Mesh is its shell: data channels, timers, compute. The self-test
// and the dataset fetch are device.js.

import { unitCounts } from "../engine/counters.js";
import { fetchDataset } from "./device.js";
import { sha256Hex } from "../units/luts.js";
import { parseDataset } from "../engine/data.js";
import { makeHyper, ModelSpec } from "../engine/spec.js";
import { paramsSha256 } from "../engine/trainer.js";
import * as W from "../wire/frames.js";
import { identityDifferences, RunPeer } from "../run/index.js";
import { createTrainer } from "./worker/trainer_proxy.js";
import { measureRun } from "./run_speed.js";
import { peersView } from "./room_view.js";
import { prepareRun } from "./run_start.js";

// -- the shell -----------------------------------------------------------------------------

const TICK_MS = 250;
/** Steps/s is measured over the commits of the last RATE_WINDOW_S seconds. */
export const RATE_WINDOW_S = 10;
/** room:peers at most this often while steps commit (membership changes: at once). */
const PEERS_EVERY_MS = 100;
const SHA_HISTORY = 512;

/** Whole messages waiting for one link, at most (a STATE or DATA message can be megabytes). */
export const SEND_QUEUE_BYTES = 96 * 1024 * 1024;

export class Mesh {
  /** @param {import("./bus.js").Bus} bus @param {import("./network.js").Network} net */
  constructor(bus, net, device) {
    this.bus = bus;
    this.net = net;
    this.device = device;
    this.peer = null;            // RunPeer, once the signaling id is known
    this.queue = Promise.resolve();
    this.reassemblers = new Map();
    this.outbox = new Map();     // peer id -> {items: whole messages, bytes, writing, gone}
    this.sendQueueBytes = SEND_QUEUE_BYTES;
    this.msgNo = 0;
    this.computing = Promise.resolve();
    this.t0 = performance.now();
    this.summary = { state: "idle" };
    this.roomHost = null;         // the room's host as the last room message said
    this.seen = new Map();        // peer id -> its last room entry {id, name, kind, capacity}
    this.shaAt = new Map();       // step -> this replica's params hash after it
    this.reports = new Map();     // peer id -> {runId, step, sha} it last reported
    this.lastShares = {};         // peer id -> micro-batches of the last committed step
    this.lastMine = null;         // a local-steps run: {step, micro} of this device's last task
    this.commits = [];            // [seconds, step] of recent commits (step rate)
    this.stopping = null;         // {by} while the host's stop is on its way
    this.dataCache = new Map();   // "task?fingerprint" -> Promise of a dataset
    this._peersTimer = null;
    this._peersAt = 0;
    bus.on("net:welcome", ({ id }) => this._enqueue(() => this._ensurePeer(id)));
    bus.on("net:room", (room) => this._enqueue(async () => {
      await this._ensurePeer(room.you);
      for (const m of room.members) this.seen.set(m.id, m);
      const old = this.roomHost;
      this.roomHost = room.host;
      const outs = await this.peer.setMembers(room.members.map((m) => m.id), room.host);
      if (old && old !== room.host) outs.push({ kind: "handover", host: room.host });
      outs.push({ kind: "peers" });
      // The host is the one who may press Start: have the default data ready by then (the
      // server prepares an embedded task on its first request, which takes seconds).
      if (room.host === room.you && !this.peer.run) this.prefetch("digits");
      return outs;
    }));
    bus.on("room:links", ({ reports }) => {
      let changed = false;
      for (const [id, r] of Object.entries(reports || {})) {
        const old = this.reports.get(id);
        if (!old || old.step !== r.step || old.sha !== r.sha || old.runId !== r.runId) changed = true;
        this.reports.set(id, r);
      }
      if (changed && this.peer) this._peers(false); // a hash report can change "hash agrees"
    });
    bus.on("net:pending", () => this._enqueue(async () => this.peer?.setMembers([], null) || []));
    bus.on("peer:open", ({ id }) => this._enqueue(async () => [...(await this.peer?.channelOpen(id) || []), { kind: "peers" }]));
    bus.on("peer:close", ({ id }) => {
      this.reassemblers.delete(id);
      this._dropOutbox(id);
      this._enqueue(async () => [...(await this.peer?.channelClosed(id) || []), { kind: "peers" }]);
    });
    bus.on("peer:message", ({ id, data }) => this._onBytes(id, data));
    // the user's commands (bus.js lists them); a request's answer is the method's promise
    bus.on("ui:start", ({ settings, resume }) => this.start(settings, resume));
    bus.on("ui:stop", ({ reason }) => { this.stop(reason); });
    bus.on("ui:snapshot", () => this.snapshot());
    bus.on("ui:restore", ({ state, steps }) => this.restore(state, steps));
    bus.on("ui:load-data", ({ task, fingerprint, name, context }) => this.loadData(task, fingerprint, name, context));
    this.timer = setInterval(() => this._enqueue(async () => this.peer?.tick(this._now()) || []), TICK_MS);
  }

  _now() { return (performance.now() - this.t0) / 1000; }

  /** The room name of a peer id (the id itself when the room never named it). */
  nameOf(id) { return this.net.nameOf ? this.net.nameOf(id) : id; }

  /** `text` with every known peer id replaced by its name; {text, peer, name} of the first. */
  _named(text) {
    const r = this.net.nameIds ? this.net.nameIds(text) : { text };
    return r;
  }

  async _ensurePeer(id) {
    if (this.peer && this.peer.me === id) return [];
    if (this.peer) this.peer.me = id; // resumed under a new id is not possible; keep the state
    else {
      this.peer = new RunPeer(id, { kind: this.device.kind, capacity: this.device.capacity,
        makeTrainer: (identity, ds) => this._makeTrainer(identity, ds) });
    }
    return [];
  }

  async _makeTrainer(identity, ds) {
    const spec = ModelSpec.fromJson(identity.model);
    const hyper = makeHyper(identity.hyper);
    const tr = await createTrainer({ spec, hyper, dataset: ds, luts: this.device.luts, units: this.device.units, kind: this.device.kind, cpuPath: this.device.cpuPath });
    await this._measureRun(tr, hyper); // before the member's ready: the split uses it
    return tr;
  }

  /** This device's micro-batches/s on the run's own model (run_speed.js). */
  async _measureRun(trainer, hyper) { this.runCapacity = await measureRun(this, trainer, hyper) ?? this.runCapacity; }

  /** Run `fn` (returning RunPeer outputs) after everything queued before it. */
  _enqueue(fn) {
    // the run's clock is brought up to now before each input (it times tasks: _timeTask)
    const clocked = () => {
      if (this.peer) this.peer.now = Math.max(this.peer.now, this._now());
      return fn();
    };
    this.queue = this.queue.then(clocked).then((outs) => this._perform(outs || [])).catch((err) => {
      console.error("mesh:", err);
      this.bus.emit("run:error", { message: `mesh error: ${err.message}` });
    });
    return this.queue;
  }

  _onBytes(id, data) {
    if (this.peer?.muted(id)) return; // a flood of bad messages: dropped before decoding (driver.js)
    let r = this.reassemblers.get(id);
    if (!r) this.reassemblers.set(id, (r = new W.Reassembler()));
    let m;
    try {
      m = r.feed(new Uint8Array(data));
    } catch (err) {
      this.reassemblers.delete(id);
      this._enqueue(async () => this.peer?.badMessage(id, err.message) || []); // named refusal (a strike)
      return;
    }
    if (!m) return;
    this._enqueue(async () => {
      if (!this.peer) return [];
      let msg;
      try {
        const tr = this.peer.trainer;
        msg = await W.fromMessage(m, tr ? tr.totalSize : null, tr ? tr.stateSizes : null);
      } catch (err) {
        return this.peer.badMessage(id, err.message);
      }
      return this.peer.receive(id, msg, m.runId); // webui/run/ drops other runs' messages, as peer/run/ does
    });
  }

  async _perform(outs) {
    for (const o of outs) {
      switch (o.kind) {
        case "send": this._send(o.to, o.message); break;
        case "compute": this._compute(o); break;
        case "fetch": this._fetch(o); break;
        case "committed": this._committed(o); break;
        case "refused": this._refused(o); break;
        case "log": {
          if (o.loud) console.warn(`[mesh] ${o.text}`); else console.log(`[mesh] ${o.text}`);
          const n = this._named(o.text);
          const who = n.peer ? { peer: n.peer, name: n.name } : {};
          if (o.loud) this.bus.emit("run:error", { message: n.text, ...who });
          else this.bus.emit("run:log", { text: n.text, ...who });
          break;
        }
        case "handover": this._handover(o.host); break;
        case "peers": this._peers(true); break;
        case "ended": await this._ended(o); break;
        case "removed": break; // its loud log line, "removed from the run by ID: why", is the page's run error
        case "joined": this._joined(); break;
        case "restored": this._restored(o); break;
        case "dataBytes": this._dataBytes(o.data); break;
        case "alarm": this.bus.emit("run:alarm", o); break; // its text is also a loud log line
        default: console.error("mesh: unknown output", o);
      }
    }
  }

  /**
   * Queue one whole message for `to`. Each link has one queue and one writer (as rtc.py):
   * the frames of a message go out back to back, never cut by the frames of the next one
   * (a receiver drops a message whose frames are interleaved with another's). network.js
   * waits while the channel holds more than 8 MiB; the queue itself holds at most
   * `sendQueueBytes` (SEND_QUEUE_BYTES) of whole messages; one message always fits an empty
   * queue. A message over the limit is not sent, and the run log says so.
   */
  _send(to, message) {
    const p = this.peer;
    let frames;
    try {
      frames = W.encode(message, p.runId, p.bounds, () => this.msgNo++);
    } catch (err) {
      console.error(`mesh: cannot encode ${message.T}:`, err);
      return false;
    }
    const bytes = frames.reduce((n, f) => n + f.byteLength, 0);
    let box = this.outbox.get(to);
    if (!box) this.outbox.set(to, (box = { items: [], bytes: 0, writing: false, gone: false }));
    if (box.items.length && box.bytes + bytes > this.sendQueueBytes) {
      const text = `the send queue to ${this.nameOf(to)} holds ${box.bytes} bytes (limit ${this.sendQueueBytes}): ${message.T} not sent`;
      console.warn(`mesh: ${text}`);
      this.bus.emit("run:log", { text, peer: to, name: this.nameOf(to) });
      return false;
    }
    box.items.push({ T: message.T, frames, bytes });
    box.bytes += bytes;
    if (!box.writing) this._write(to, box);
    return true;
  }

  /** The one writer of a link: whole messages, in order, until the queue is empty. */
  async _write(to, box) {
    box.writing = true;
    try {
      while (box.items.length && !box.gone) {
        const item = box.items[0];
        try {
          for (const f of item.frames) {
            if (box.gone) break;
            await this.net.send(to, f);
          }
        } catch (err) {
          console.warn(`mesh: sending ${item.T} to ${to} failed: ${err.message}`);
        }
        box.items.shift();
        box.bytes -= item.bytes;
      }
    } finally {
      box.writing = false;
    }
  }

  /** The link to `id` closed: what it still had to send is dropped (a new link starts clean). */
  _dropOutbox(id) {
    const box = this.outbox.get(id);
    if (!box) return;
    box.gone = true;
    box.items.length = 0;
    box.bytes = 0;
    this.outbox.delete(id);
  }

  /** Resolves once the computes queued so far are done, those that the outputs being
   *  performed now queue included (a turn later): the page's live views wait for it, so that
   *  a view never sits on the compute worker ahead of this step's share (eval_budget.js). */
  async computeIdle() {
    await new Promise((resolve) => setTimeout(resolve, 0));
    await this.computing;
  }

  /** Bytes of whole messages waiting to be sent, per peer id. */
  queuedBytes() {
    return Object.fromEntries([...this.outbox].map(([id, b]) => [id, b.bytes]));
  }

  _compute({ step, task, micro, theta, term = null }) {
    const tr = this.peer.trainer;
    this.computing = this.computing.then(async () => {
      let res;
      const t0 = performance.now();
      try {
        res = await contributeAt(tr, theta, step, micro);
      } catch (err) {
        if (err.name === "StaleRound") return; // local steps: the room moved past this round (run/split.py contribute_at)
        if (tr.engine.units === this.device.cpu) throw err;
        this.bus.emit("run:log", { text: `the GPU failed (${err.message}); computing on ${this.device.cpuPath === "wasm" ? "WebAssembly SIMD" : "the JS units"} from now on` });
        tr.setUnits(this.device.cpu);
        res = await contributeAt(tr, theta, step, micro);
      }
      if (tr.replicas !== undefined) this.lastMine = { step, micro: [...micro] }; // a local-steps run's replicas
      const took = (performance.now() - t0) / 1000;
      this._enqueue(async () => this.peer.computed(step, task, res, term, took));
    }).catch((err) => this.bus.emit("run:error", { message: `compute failed: ${err.message}` }));
  }

  /** The dataset of `task` (and `fingerprint`), fetched once per page (checked, parsed);
   *  `context`: that text windowed with so many ids (`--context`, the server makes it). */
  loadData(task, fingerprint = null, label = null, context = null) {
    const key = `${task}?${fingerprint || ""}&${context ?? ""}`;
    if (!this.dataCache.has(key)) {
      const p = fetchDataset(task, fingerprint, label, context);
      this.dataCache.set(key, p);
      p.catch(() => this.dataCache.delete(key)); // a failure is not kept: the next try asks again
    }
    return this.dataCache.get(key);
  }

  /** Start fetching a dataset early (the server prepares an embedded task on first use). */
  prefetch(task = "digits", fingerprint = null) {
    this.loadData(task, fingerprint).catch(() => {});
  }

  _preparing(stage, done, total, text) {
    this.bus.emit("run:preparing", { stage, done, total, text });
  }

  _fetch({ task, fingerprint }) {
    this._state("starting", `joining the run: fetching the ${task} data`);
    this._preparing("data", 0, 3, `fetching the ${task} data`);
    (async () => {
      let ds = null;
      try {
        ds = await this.loadData(task, fingerprint || null);
        this._preparing("model", 1, 3, "building the model");
      } catch (err) {
        console.warn(`mesh: ${err.message}`);
        this.bus.emit("run:log", { text: `${err.message}: asking the host for the data` });
      }
      this._enqueue(async () => this.peer.data(ds));
    })();
  }

  _dataBytes(bytes) {
    (async () => {
      let ds = null;
      try {
        ds = parseDataset(bytes);
        ds.fingerprint = await sha256Hex(bytes);
        ds.bytes = bytes;
      } catch (err) {
        console.warn(`mesh: the coordinator's dataset did not parse: ${err.message}`);
      }
      this._enqueue(async () => this.peer.data(ds));
    })();
  }

  _state(state, text) {
    const p = this.peer;
    this.summary = { ...this.summary, state, text };
    this.bus.emit("run:state", { state, text, runId: p?.runId || null, steps: p?.run?.steps ?? null,
      step: p?.step ?? 0 });
  }

  _joined() {
    const p = this.peer;
    this._resetRun();
    p.doneBy = {}; // a new run: what was done in the last one is not this one's work
    this._preparing("ready", 3, 3, "ready: waiting for the first step");
    this.summary = { ...this.summary, runId: p.runId, steps: p.run.steps };
    this._state("running", `training run ${p.runId} (${p.run.identity.task}, ${p.run.steps} steps)`);
  }

  _committed(o) {
    const p = this.peer;
    const step = o.step + 1;
    const shares = Object.fromEntries(o.contributors);
    const done = { ...p.doneBy };
    const names = Object.fromEntries(Object.keys(done).map((id) => [id, this.nameOf(id)]));
    this.lastShares = shares;
    this.shaAt.set(step, p.sha);
    if (this.shaAt.size > SHA_HISTORY) this.shaAt.delete(this.shaAt.keys().next().value);
    if (p.host && p.host !== p.me) this.reports.set(p.host, { runId: p.runId, step, sha: o.params_sha256 });
    const now = this._now();
    this.commits.push([now, step]);
    while (this.commits.length > 2 && now - this.commits[0][0] > RATE_WINDOW_S) this.commits.shift();
    this.net.setReport?.({ runId: p.runId, step, sha: p.sha });
    this.summary = { ...this.summary, step, loss: o.loss, sha: o.params_sha256, shares, done };
    this.bus.emit("run:step", { step, loss: o.loss, sha: o.params_sha256, shares, done, names,
      mine: o.mine, runId: p.runId, steps: p.run?.steps ?? null });
    const counters = this.counters();
    if (counters) this.bus.emit("counters", counters);
    this._peers(false);
  }

  /** Cluster-wide unit invocations of the run so far (step x micro-batches per step), or null. */
  counters() {
    const tr = this.peer?.trainer;
    if (!tr) return null;
    const micro = tr.step * (tr.hp.batch / tr.hp.micro_batch);
    return { ...unitCounts(tr.spec, tr.hp.micro_batch, micro), micro, step: tr.step,
      steps: this.peer.run?.steps ?? null };
  }

  /** A new run (or joining one): what was measured for the last one starts over. */
  _resetRun() {
    this.shaAt.clear();
    this.lastShares = {};
    this.lastMine = null;
    this.commits = [];
    this.stopping = null;
  }

  /** Steps per second over the last RATE_WINDOW_S seconds of commits; null before two. */
  stepRate() {
    const c = this.commits;
    if (c.length < 2) return null;
    const dt = c[c.length - 1][0] - c[0][0];
    return dt > 0 ? (c[c.length - 1][1] - c[0][1]) / dt : null;
  }

  /** The room:peers event's detail (bus.js, room_view.js). */
  peersView() { return peersView(this); }

  /** Emit room:peers: at once, or (while steps commit) at most every PEERS_EVERY_MS. */
  _peers(now) {
    const t = performance.now();
    if (now || t - this._peersAt >= PEERS_EVERY_MS) {
      clearTimeout(this._peersTimer);
      this._peersTimer = null;
      this._peersAt = t;
      this.bus.emit("room:peers", this.peersView());
    } else if (!this._peersTimer) {
      this._peersTimer = setTimeout(() => { this._peersTimer = null; this._peers(true); }, PEERS_EVERY_MS);
    }
  }

  _handover(host) {
    const p = this.peer;
    if (!p?.run || !p.trainer || p.ended) return;
    const you = host === p.me;
    const hostName = this.nameOf(host);
    const text = you ? `you are now the host: the run goes on from step ${p.step}`
      : `${hostName} is now the host: the run goes on from step ${p.step}`;
    this.bus.emit("run:handover", { step: p.step, you, host, hostName, text });
  }

  _refused(o) {
    const name = this.nameOf(o.peer);
    const reasons = o.reasons.map((r) => this._named(r).text);
    const text = o.peer === this.peer.me
      ? `refused: ${reasons.join("; ")}`
      : `${name} refused the run: ${reasons.join("; ")}`;
    this.bus.emit("run:refused", { peer: o.peer, name, reasons, message: text });
    if (o.peer === this.peer.me) this._state("refused", text);
    else this.bus.emit("run:log", { text, peer: o.peer, name });
  }

  async _ended(o) {
    const p = this.peer;
    const accuracy = await p.trainer.accuracy("test");
    const planned = p.run?.steps ?? o.step;
    if (o.step < planned || this.stopping) {
      const by = this.stopping?.by || p.host;
      const byName = by === p.me ? "you" : this.nameOf(by);
      const text = by === p.me ? `you stopped the run at step ${o.step}`
        : `${byName} (the host) stopped the run at step ${o.step} of ${planned}`;
      this.bus.emit("run:stopped", { by, byName, step: o.step, text });
    }
    this.stopping = null;
    const text = o.agreed
      ? `done after ${o.step} steps: params-sha256 ${o.params_sha256}`
      : `the run ended but this replica differs from the coordinator (params ${o.params_sha256.slice(0, 16)}…)`;
    const counters = this.counters();
    this.summary = { ...this.summary, state: "done", step: o.step, sha: o.params_sha256, agreed: o.agreed, accuracy, counters };
    this.bus.emit("run:done", { state: "done", text, step: o.step, sha: o.params_sha256, agreed: o.agreed, accuracy, counters });
    this._peers(true);
  }

  // -- what the host asks for ------------------------------------------------------------------

  /**
   * Start a run from the host's settings (same meaning and defaults as `daisychain train`),
   * from a checked checkpoint state with `resume`: run_start.js prepares it, then it is
   * announced to the room.
   */
  async start(settings = {}, resume = null) {
    const { trainer, identity, id, task, steps, verify_rate, aggregate } = await prepareRun(this, settings, resume);
    this._preparing("announce", 3, 4, "announcing the run to the room");
    return this._enqueue(async () => {
      this._resetRun();
      if (verify_rate !== null) this.peer.verifyRate = verify_rate; // the room's spot-checks and
      if (aggregate !== null) this.peer.aggregate = aggregate;       // aggregation (run/ring.js)
      const outs = await this.peer.hostRun(trainer, identity, id, steps, this._now());
      this._preparing("ready", 4, 4, "ready: the first step is assigned");
      this.summary = { state: "running", runId: id, steps, step: trainer.step };
      this._state("running", `training run ${id} (${task}, ${steps} steps)`);
      return outs;
    });
  }

  /** Whether this tab holds a replica (something to download). */
  hasState() { return !!this.peer?.trainer; }

  /** Whether this tab coordinates a run it can restore. */
  canRestore() { return !!(this.peer?.coordinating && this.peer.trainer && this.peer.run); }

  /** The replica's state between two steps: {identity, runId, step, theta, m, v, b1t, b2t} (+ vocab, text runs). */
  snapshot() {
    return this._call(async () => {
      const p = this.peer;
      if (!p?.trainer) throw new Error("this device holds no run state yet");
      const tr = p.trainer;
      if (tr.nTasks !== undefined && tr.replicas !== undefined) { // engine/local.js LocalTrainer
        throw new Error("a tab does not write a local-steps run's checkpoint yet: save it with daisy-peer --save-checkpoint");
      }
      const vocab = tr.ds?.meta?.vocab; // a text model's characters ride along to the .pt
      return { identity: p.identity, runId: p.runId, ...tr.snapshot(),
        ...(typeof vocab === "string" ? { vocab } : {}) };
    });
  }

  /** The host restores the room from a checked state; resolves once it is sent to everyone. */
  restore(st, steps = null) {
    return this._call(async () => {
      const p = this.peer;
      if (!this.canRestore()) throw new Error("only the host of a run restores the room");
      const diffs = identityDifferences(p.identity, st.identity).map((d) => d.replace(" in the run", " in the checkpoint"));
      if (diffs.length) throw new Error(`the checkpoint belongs to another run: ${diffs.join("; ")}`);
      await this._perform(await p.restore(st, this._now(), steps));
      return { step: st.step, sha: p.sha };
    });
  }

  /** Run `fn` in the queue (between two protocol events) and resolve with its value. */
  _call(fn) {
    return new Promise((resolve, reject) => {
      this._enqueue(async () => {
        try {
          resolve(await fn());
        } catch (err) {
          reject(err);
        }
        return [];
      });
    });
  }

  _restored(o) {
    const p = this.peer;
    const byName = o.by === p.me ? "you" : this.nameOf(o.by);
    const text = `restored from a checkpoint by ${byName}: step ${o.step}, params-sha256 ${o.params_sha256}`;
    this.summary = { ...this.summary, state: "running", step: o.step, sha: o.params_sha256 };
    this.shaAt.clear();
    this.commits = [];
    this.bus.emit("run:restored", { step: o.step, sha: o.params_sha256, by: o.by, byName, runId: p.runId, steps: p.steps });
    this._state("running", text);
  }

  stop(why = "the host stopped the run") {
    return this._enqueue(async () => {
      if (!this.peer?.coordinating || this.peer.ended) return [];
      this.stopping = { by: this.peer.me };
      return this.peer.stop(why);
    });
  }
}

/** Trainer.contribute on a parameter snapshot, for micro-batch ids `micro` of `step` (the
 *  inputs augmented as the run says: Trainer.inputs). */
export async function contributeAt(tr, theta, step, micro) {
  if (tr.contributeAt) return tr.contributeAt(theta, step, micro); // worker/trainer_proxy.js
  return tr.contribute(micro, step, theta);
}

export { paramsSha256 };
export { fetchDataset, selfTestDevice } from "./device.js";

// The tab's part in a run: its self-test, and the run protocol of docs/MESH.md spoken over
// the data channels of network.js, every byte through frames.js (docs/MESH.md). No DOM: what happens is
// reported on the bus (run:state, run:step, run:done, run:error, run:refused).
//
//   const device = await selfTestDevice();            // {kind, reason, capacity, units, ...}
//   const mesh = new Mesh(bus, net, device);          // follows the room's coordinator
//   await mesh.start(settings);                       // the host: announce and coordinate
//
// The run logic itself is the sans-I/O RunPeer of runpeer.js-style code below (a line-for-
// line port of daisychain/peer/run.py); Mesh is its shell: data channels, timers, compute.

import { loadLuts, sha256Hex } from "./luts.js";
import { floatFailures, goldenFailure, microBatchRate } from "./engine/conformance.js";
import { loadDataset, parseDataset } from "./engine/data.js";
import { openPaths } from "./engine/paths.js";
import { choosePath } from "./gpu.js";
import { makeHyper, modelFor, ModelSpec } from "./engine/spec.js";
import { paramsSha256, runId, runIdentity, Trainer } from "./engine/trainer.js";
import * as W from "./frames.js";
import { identityDifferences, RunPeer } from "./runpeer.js";

// -- self-test -----------------------------------------------------------------------------

async function fetchGolden(name) {
  const resp = await fetch(`/golden/${name}`, { cache: "no-store" });
  if (!resp.ok) throw new Error(`/golden/${name}: HTTP ${resp.status}`);
  return resp.json();
}

/**
 * Test this device: tables through the manifest, golden vectors on the WebGPU path and the
 * JS units, one Adam step on the golden Adam vectors and the golden subnormal operations
 * (float64 in JS, the same for every path), the micro-batch rate of each path that passes;
 * the tab computes on the faster one, and `reason` says why in words (gpu.js choosePath;
 * `choice` holds the rates too).
 * @param {{want?: "gpu"|"cpu"|null}} o  want "cpu" skips the GPU; "gpu" computes on it if it passes
 * @returns {Promise<{kind, reason, capacity, rates, choice, units, cpu, luts, manifestSha256, paths}>}
 */
export async function selfTestDevice({ want = null } = {}) {
  const luts = await loadLuts("/luts/");
  const golden = await fetchGolden("units.json");
  const floats = await floatFailures(await fetchGolden("selftest.json"));
  if (floats.length) {
    throw new Error(`this device cannot train: its float64 arithmetic failed the self-test (${floats.slice(0, 3).join("; ")})`);
  }
  if (golden.manifest_sha256 !== luts.manifestSha256) {
    throw new Error(`refused: LUT manifest differs (golden vectors for ${golden.manifest_sha256.slice(0, 12)}…, tables ${luts.manifestSha256.slice(0, 12)}…)`);
  }
  const opened = await openPaths(luts, { tryGpu: want !== "cpu" });
  const paths = { gpu: null, cpu: null, float64: "pass" };
  let gpu = opened.gpu;
  let gpuWhy = opened.gpuReason;
  if (gpu) {
    const f = await goldenFailure(gpu, golden);
    if (f || !gpu.usable) {
      gpuWhy = `the WebGPU path failed its self-test (${f || gpu.failure})`;
      gpu = null;
    }
  }
  const cpuFail = await goldenFailure(opened.cpu, golden);
  if (!gpu && cpuFail) throw new Error(`this device cannot train: the JS units failed their self-test (${cpuFail})`);
  // Both paths that pass are measured; the tab computes on the faster (gpu.js choosePath).
  const rates = { gpu: null, cpu: cpuFail ? null : await microBatchRate(opened.cpu) };
  if (gpu) {
    try {
      rates.gpu = await microBatchRate(gpu);
      if (!gpu.usable) throw new Error(gpu.failure);
    } catch (err) {
      gpuWhy = `the WebGPU path failed while measuring (${err.message})`;
      gpu = null;
      rates.gpu = null;
      if (cpuFail) throw new Error(`this device cannot train: ${gpuWhy}; the JS units failed their self-test (${cpuFail})`);
    }
  }
  paths.gpu = gpu ? "pass" : gpuWhy;
  paths.cpu = cpuFail ? `failed: ${cpuFail}` : "pass";
  const adapter = gpu?.adapterInfo?.vendor ? `${gpu.adapterInfo.vendor} ${gpu.adapterInfo.architecture || ""}`.trim() : "";
  const choice = choosePath({ rates, want, gpuWhy, cpuWhy: cpuFail, adapter });
  const units = choice.path === "gpu" ? gpu : opened.cpu;
  return { kind: choice.path === "gpu" ? "webgpu" : "cpu", reason: choice.reason, capacity: rates[choice.path],
    rates, choice, units, cpu: opened.cpu, luts, manifestSha256: luts.manifestSha256, paths };
}

// -- the shell -----------------------------------------------------------------------------

const TICK_MS = 250;
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
    bus.on("net:welcome", ({ id }) => this._enqueue(() => this._ensurePeer(id)));
    bus.on("net:room", (room) => this._enqueue(async () => {
      await this._ensurePeer(room.you);
      return this.peer.setMembers(room.members.map((m) => m.id), room.host);
    }));
    bus.on("net:pending", () => this._enqueue(async () => this.peer?.setMembers([], null) || []));
    bus.on("peer:open", ({ id }) => this._enqueue(async () => this.peer?.channelOpen(id) || []));
    bus.on("peer:close", ({ id }) => {
      this.reassemblers.delete(id);
      this._dropOutbox(id);
      this._enqueue(async () => this.peer?.channelClosed(id) || []);
    });
    bus.on("peer:message", ({ id, data }) => this._onBytes(id, data));
    this.timer = setInterval(() => this._enqueue(async () => this.peer?.tick(this._now()) || []), TICK_MS);
  }

  _now() { return (performance.now() - this.t0) / 1000; }

  async _ensurePeer(id) {
    if (this.peer && this.peer.me === id) return [];
    if (this.peer) this.peer.me = id; // resumed under a new id is not possible; keep the state
    else {
      this.peer = new RunPeer(id, { kind: this.device.kind, capacity: this.device.capacity,
        makeTrainer: (identity, ds) => this._makeTrainer(identity, ds) });
    }
    return [];
  }

  _makeTrainer(identity, ds) {
    const spec = ModelSpec.fromJson(identity.model);
    const hyper = makeHyper(identity.hyper);
    return Trainer.create({ spec, hyper, dataset: ds, luts: this.device.luts, units: this.device.units });
  }

  /** Run `fn` (returning RunPeer outputs) after everything queued before it. */
  _enqueue(fn) {
    this.queue = this.queue.then(fn).then((outs) => this._perform(outs || [])).catch((err) => {
      console.error("mesh:", err);
      this.bus.emit("run:error", { message: `mesh error: ${err.message}` });
    });
    return this.queue;
  }

  _onBytes(id, data) {
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
        msg = await W.fromMessage(m, this.peer.trainer ? this.peer.trainer.layout.size : null);
      } catch (err) {
        return this.peer.badMessage(id, err.message);
      }
      return this.peer.receive(id, msg, m.runId); // runpeer.js drops other runs' messages, as run.py
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
        case "log":
          if (o.loud) console.warn(`[mesh] ${o.text}`); else console.log(`[mesh] ${o.text}`);
          if (o.loud) this.bus.emit("run:error", { message: o.text });
          else this.bus.emit("run:log", { text: o.text });
          break;
        case "ended": await this._ended(o); break;
        case "failed": this.bus.emit("run:error", { message: o.reason }); break;
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
      const text = `the send queue to ${to} holds ${box.bytes} bytes (limit ${this.sendQueueBytes}): ${message.T} not sent`;
      console.warn(`mesh: ${text}`);
      this.bus.emit("run:log", { text });
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

  /** Bytes of whole messages waiting to be sent, per peer id. */
  queuedBytes() {
    return Object.fromEntries([...this.outbox].map(([id, b]) => [id, b.bytes]));
  }

  _compute({ step, task, micro, theta }) {
    const tr = this.peer.trainer;
    this.computing = this.computing.then(async () => {
      let res;
      try {
        res = await contributeAt(tr, theta, step, micro);
      } catch (err) {
        if (tr.engine.units === this.device.cpu) throw err;
        this.bus.emit("run:log", { text: `the GPU failed (${err.message}); computing on the JS units from now on` });
        tr.setUnits(this.device.cpu);
        res = await contributeAt(tr, theta, step, micro);
      }
      this._enqueue(async () => this.peer.computed(step, task, res));
    }).catch((err) => this.bus.emit("run:error", { message: `compute failed: ${err.message}` }));
  }

  _fetch({ task }) {
    const url = `/data/${encodeURIComponent(task)}.dcds`;
    this._state("starting", `joining the run: fetching the ${task} data`);
    (async () => {
      let ds = null;
      try {
        ds = await loadDataset(url);
      } catch (err) {
        console.warn(`mesh: ${url}: ${err.message}`);
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
    this.summary = { ...this.summary, runId: p.runId, steps: p.run.steps };
    this._state("running", `training run ${p.runId} (${p.run.identity.task}, ${p.run.steps} steps)`);
  }

  _committed(o) {
    const shares = Object.fromEntries(o.contributors);
    const done = { ...this.peer.doneBy };
    this.summary = { ...this.summary, step: o.step + 1, loss: o.loss, sha: o.params_sha256, shares, done };
    this.bus.emit("run:step", { step: o.step + 1, loss: o.loss, sha: o.params_sha256, shares, done,
      mine: o.mine, runId: this.peer.runId, steps: this.peer.run?.steps ?? null });
  }

  _refused(o) {
    const text = o.peer === this.peer.me
      ? `refused: ${o.reasons.join("; ")}`
      : `${o.peer} refused the run: ${o.reasons.join("; ")}`;
    this.bus.emit("run:refused", { peer: o.peer, reasons: o.reasons, message: text });
    if (o.peer === this.peer.me) this._state("refused", text);
    else this.bus.emit("run:log", { text });
  }

  async _ended(o) {
    const accuracy = await this.peer.trainer.accuracy("test");
    const text = o.agreed
      ? `done after ${o.step} steps: params-sha256 ${o.params_sha256}`
      : `the run ended but this replica differs from the coordinator (params ${o.params_sha256.slice(0, 16)}…)`;
    this.summary = { ...this.summary, state: "done", step: o.step, sha: o.params_sha256, agreed: o.agreed, accuracy };
    this.bus.emit("run:done", { state: "done", text, step: o.step, sha: o.params_sha256, agreed: o.agreed, accuracy });
  }

  // -- what the host asks for ------------------------------------------------------------------

  /**
   * Start a run from the host's settings (same meaning and defaults as `daisychain train`);
   * `resume` (a checked checkpoint state, see checkpoint.js) starts it from that state, if
   * the settings make the same run. `layers` (an array of hidden widths, `--layers`) wins over
   * `hidden` (one hidden layer, `--hidden`) when given.
   */
  async start({ task = "digits", steps = 600, seed = 0, batch = 64, micro_batch = 16, lr = 3e-3, hidden = 128, layers = null } = {}, resume = null) {
    if (!this.net.room || this.net.room.host !== this.net.id) throw new Error("only the host starts a run");
    if (this.peer?.coordinating && !this.peer.ended) throw new Error("a run is already going");
    const hyper = makeHyper({ seed, batch, micro_batch, lr });
    if (!Number.isInteger(steps) || steps < 0) throw new Error("steps must be a whole number >= 0");
    this._state("starting", `preparing the ${task} run`);
    const ds = await loadDataset(`/data/${encodeURIComponent(task)}.dcds`);
    const spec = modelFor(ds, layers ?? hidden, 16);
    const trainer = await Trainer.create({ spec, hyper, dataset: ds, luts: this.device.luts, units: this.device.units });
    const identity = runIdentity(spec, hyper, ds, this.device.luts);
    const id = await runId(identity);
    if (resume) {
      const diffs = identityDifferences(identity, resume.identity).map((d) => d.replace(" in the run", " in the checkpoint"));
      const why = diffs.length ? `these settings make another run than the loaded checkpoint's: ${diffs.join("; ")}`
        : resume.step > steps ? `the checkpoint is at step ${resume.step}, past the ${steps} steps of the run` : null;
      if (why) {
        this._state("idle", why);
        throw new Error(why);
      }
      loadState(trainer, resume);
    }
    return this._enqueue(async () => {
      const outs = await this.peer.hostRun(trainer, identity, id, steps, this._now());
      this.summary = { state: "running", runId: id, steps, step: trainer.step };
      this._state("running", `training run ${id} (${task}, ${steps} steps)`);
      return outs;
    });
  }

  /** Whether this tab holds a replica (something to download). */
  hasState() { return !!this.peer?.trainer; }

  /** Whether this tab coordinates a run it can restore. */
  canRestore() { return !!(this.peer?.coordinating && this.peer.trainer && this.peer.run); }

  /** The replica's state between two steps: {identity, runId, step, theta, m, v, b1t, b2t}. */
  snapshot() {
    return this._call(async () => {
      const p = this.peer;
      if (!p?.trainer) throw new Error("this device holds no run state yet");
      const tr = p.trainer;
      return { identity: p.identity, runId: p.runId, step: tr.step, theta: tr.theta.slice(),
        m: tr.adam.m.slice(), v: tr.adam.v.slice(), b1t: tr.adam.b1t, b2t: tr.adam.b2t };
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
    const by = o.by === p.me ? "you" : o.by;
    const text = `restored from a checkpoint by ${by}: step ${o.step}, params-sha256 ${o.params_sha256}`;
    this.summary = { ...this.summary, state: "running", step: o.step, sha: o.params_sha256 };
    this.bus.emit("run:restored", { step: o.step, sha: o.params_sha256, by: o.by, runId: p.runId, steps: p.steps });
    this._state("running", text);
  }

  stop(why = "the host stopped the run") {
    return this._enqueue(async () => (this.peer ? this.peer.stop(why) : []));
  }
}

/** Put a checked state {step, theta, m, v, b1t, b2t} into a fresh trainer. */
function loadState(tr, st) {
  if (st.theta.length !== tr.theta.length) throw new Error(`the checkpoint holds ${st.theta.length} parameters, the model ${tr.theta.length}`);
  tr.theta.set(st.theta);
  tr.adam.m.set(st.m);
  tr.adam.v.set(st.v);
  tr.adam.b1t = st.b1t;
  tr.adam.b2t = st.b2t;
  tr.adam.step = st.step;
  tr.step = st.step;
}

/** Trainer.contribute on a parameter snapshot, for micro-batch ids `micro` of `step`. */
export async function contributeAt(tr, theta, step, micro) {
  const grad = new Float64Array(tr.layout.size);
  const loss = new Float64Array(micro.length);
  const correct = new Int32Array(micro.length);
  const mb = tr.hp.micro_batch;
  for (let i = 0; i < micro.length; i++) {
    const idx = tr.samples(step, micro[i]);
    const x = new tr.ds.x_train.data.constructor(idx.length * tr.rowLen);
    idx.forEach((r, k) => x.set(tr.ds.x_train.data.subarray(r * tr.rowLen, (r + 1) * tr.rowLen), k * tr.rowLen));
    const y = Int32Array.from(idx, (r) => tr.ds.y_train.data[r]);
    const r = await tr.engine.gradInto(grad, theta, x, y, mb, tr.hp.grad_frac_bits, tr.limit);
    loss[i] = r.loss;
    correct[i] = r.correct;
  }
  return { grad, loss, correct };
}

export { paramsSha256 };

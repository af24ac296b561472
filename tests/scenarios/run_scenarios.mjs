// The JS runner of the shared run-protocol scenarios (tests/scenarios/*.json): the same ops
// as scenario_net.py, driving webui/run/ over frames.js with the JS engine on the same tiny
// model, writing the same normalised output list. Input on stdin:
//   {webui, luts, dcds, identity, steps, scenarios: [{name, settings, events}]}
// Output on stdout: [{name, outputs, final} | {name, error}].
// With --serve it hosts the JS replicas of a mixed room instead (scenario_mixed.py): the first
// stdin line is {webui, luts}, then one JSON request a line, one JSON answer a line (serve()).
import { readFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { createInterface } from "node:readline";

const serving = process.argv[2] === "--serve";
const lines = serving ? createInterface({ input: process.stdin })[Symbol.asyncIterator]() : null;
const input = JSON.parse(serving ? (await lines.next()).value : readFileSync(0, "utf8"));
const W = await import(`${input.webui}/wire/frames.js`);
const { RunPeer } = await import(`${input.webui}/run/index.js`);
const T = await import(`${input.webui}/engine/trainer.js`);
const L = await import(`${input.webui}/engine/local.js`);
const { ModelSpec, makeHyper } = await import(`${input.webui}/engine/spec.js`);
const { parseDataset } = await import(`${input.webui}/engine/data.js`);
const { CpuUnits } = await import(`${input.webui}/engine/cpu_units.js`);
const { loadLuts } = await import(`${input.webui}/units/luts.js`);

// loadLuts reads over fetch: serve the committed tables from disk
globalThis.fetch = async (url) => {
  const bytes = readFileSync(url);
  return { ok: true, status: 200, json: async () => JSON.parse(bytes.toString("utf8")),
    arrayBuffer: async () => bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) };
};
const luts = await loadLuts(`${input.luts}/`);
const units = new CpuUnits(luts);
const MAX_ITER = 20000;
const TYPE_NAME = Object.fromEntries(Object.entries(W.FrameType).map(([k, v]) => [v, k.toLowerCase()]));

async function loadDs(path) {
  const bytes = readFileSync(path);
  const buffer = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
  const ds = parseDataset(buffer);
  ds.fingerprint = createHash("sha256").update(bytes).digest("hex");
  ds.bytes = new Uint8Array(buffer);
  return ds;
}

const bodySha = (body) => createHash("sha256").update(body).digest("hex").slice(0, 16);

/** Flip bit 12 of an integer held in a double, as int64 XOR does (two's complement). */
function flip12(v) {
  const bit = ((Math.floor(v / 4096) % 2) + 2) % 2;
  return bit ? v - 4096 : v + 4096;
}

function corrupt(ints, fault, step, last = null) {
  const out = Float64Array.from(ints);
  if (fault === "stale") { // the previous contribution again (zeros at first)
    const prev = last.ints ?? new Float64Array(out.length);
    last.ints = out;
    return prev;
  }
  if (fault === "flip") out[step % out.length] = flip12(out[step % out.length]);
  else if (fault === "scale") for (let i = 0; i < out.length; i++) out[i] *= 2;
  else if (fault === "huge") out[0] = 2 ** 52;
  else if (fault === "neg-half") out[out.length - 1] = -1; // a local-steps run's: the last moment half negative
  else throw new Error(`unknown fault ${fault}`);
  return out;
}

async function contributeAt(tr, theta, step, micro) {
  if (tr.replicas !== undefined) { // engine/local.js: a round (none when the room moved past it, as mesh.js)
    try {
      return await tr.contribute(micro, step, theta);
    } catch (err) {
      if (err.name === "StaleRound") return null;
      throw err;
    }
  }
  const grad = new Float64Array(tr.layout.size);
  const loss = new Float64Array(micro.length);
  const correct = new Int32Array(micro.length);
  for (let i = 0; i < micro.length; i++) {
    const idx = tr.samples(step, micro[i]);
    const x = new tr.ds.x_train.data.constructor(idx.length * tr.rowLen);
    idx.forEach((r, k) => x.set(tr.ds.x_train.data.subarray(r * tr.rowLen, (r + 1) * tr.rowLen), k * tr.rowLen));
    const y = Int32Array.from(idx, (r) => tr.ds.y_train.data[r]);
    const r = await tr.engine.gradInto(grad, theta, x, y, tr.hp.micro_batch, tr.hp.grad_frac_bits, tr.limit);
    loss[i] = r.loss;
    correct[i] = r.correct;
  }
  return { grad, loss, correct };
}

/** scenario_net.py loss12: a displayed loss to 12 significant digits (its log is each
 * language's libm, which may differ in the last place; the run's bits never depend on it). */
const loss12 = (x) => (typeof x === "number" ? Number(x.toPrecision(12)) : x);

async function normMessage(m) {
  const kind = m.type === W.FrameType.CONTROL ? m.meta.t : TYPE_NAME[m.type];
  let body = m.body;
  if ((m.type === W.FrameType.CONTRIB || m.type === W.FrameType.TOTAL || m.type === W.FrameType.RING) && m.codec !== W.Codec.NONE) {
    try {
      const v = await W.decodeInts(m.codec, m.body);
      body = new Uint8Array(BigInt64Array.from(v, (x) => BigInt(x)).buffer);
    } catch (err) { // hostile bytes (an injected body no decoder takes): as sent
      if (!(err instanceof W.FrameError)) throw err;
    }
  }
  const meta = "loss" in m.meta ? { ...m.meta, loss: loss12(m.meta.loss) } : m.meta;
  return [kind, m.runId, m.step, meta, bodySha(body)];
}

function normOutput(pid, o) {
  switch (o.kind) {
    case "compute": return ["compute", pid, o.step, o.task, [...o.micro]];
    case "fetch": return ["fetch", pid, o.task, o.fingerprint];
    case "committed": return ["committed", pid, o.step, loss12(o.loss), o.contributors.map(([p, n]) => [p, n]), o.mine, o.params_sha256];
    case "refused": return ["refused", pid, o.peer, [...o.reasons]];
    case "log": return ["log", pid, !!o.loud, o.text];
    case "ended": return ["ended", pid, o.step, o.params_sha256, !!o.agreed];
    case "removed": return ["removed", pid, o.by, o.reason];
    case "restored": return ["restored", pid, o.step, o.params_sha256, o.by];
    case "alarm": return ["alarm", pid, o.alarm, o.peer, o.name, o.step, o.micro, o.strikes, o.text];
    default: throw new Error(`unknown output ${o.kind}`);
  }
}

/** scenario_net.py xorshift32: the simulator's random numbers (32-bit xorshift). */
function xorshift32(x) {
  x = (x ^ (x << 13)) >>> 0;
  x = (x ^ (x >>> 17)) >>> 0;
  return (x ^ (x << 5)) >>> 0;
}

/** scenario_net.py Sched: the "sim" op's schedule on a virtual clock (whole ms). */
class Sched {
  constructor(e) {
    this.x = e.rng || 1;
    this.now = 0;
    this.delay = e.delay_ms ?? [1, 50];
    this.compute = e.compute_ms ?? {};
    this.default = e.compute_default_ms ?? [5, 50];
    this.last = new Map(); // "from>to" -> the last due time on that pair
    this.busy = new Map(); // peer -> when its last compute finishes
  }

  draw(lo, hi) {
    this.x = xorshift32(this.x);
    return lo + (this.x % (hi - lo + 1));
  }

  messageDue(from, to) {
    const key = `${from}>${to}`;
    const due = Math.max(this.now + this.draw(...this.delay), this.last.get(key) ?? 0);
    this.last.set(key, due);
    return due;
  }

  computeDue(pid) {
    const due = Math.max(this.now, this.busy.get(pid) ?? 0) + this.draw(...(this.compute[pid] ?? this.default));
    this.busy.set(pid, due);
    return due;
  }
}

class Net {
  constructor(sc, ds) {
    this.sc = sc;
    this.ds = ds;
    this.peers = new Map();
    this.faults = new Map();
    this.last = new Map(); // a stale liar's previous contribution
    this.dead = new Set();
    this.held = new Set();
    this.wire = [];
    this.links = new Map(); // "from>to" -> messages still let through (0: held)
    this.computes = [];
    this.sim = null; // the "sim" op's schedule, while it runs
    this.reasm = new Map();
    this.msgNo = new Map();
    this.snapshots = new Map();
    this.out = [];
    this.host = null; // the room's host, as the last room op said
  }

  live() { return [...this.peers.keys()].filter((p) => !this.dead.has(p)).sort(); }

  async feed(pid, outputs) {
    for (const o of outputs) {
      if (o.kind === "send") {
        let msg = o.message;
        const fault = this.faults.get(pid);
        if (fault && msg.T === "contrib") {
          if (!this.last.has(pid)) this.last.set(pid, {});
          msg = { ...msg, ints: corrupt(msg.ints, fault, msg.step, this.last.get(pid)) };
        }
        const p = this.peers.get(pid);
        const no = this.nextNo(pid);
        const frames = W.encode(msg, p.runId, p.bounds, () => no);
        await this.record(pid, o.to, frames);
        this.push(pid, o.to, frames);
        continue;
      }
      if (o.kind === "joined") continue; // the page's cue, no protocol output
      if (o.kind === "dataBytes") continue;
      this.out.push(normOutput(pid, o));
      if (o.kind === "compute") this.computes.push([pid, o, this.sim ? this.sim.computeDue(pid) : 0]);
      else if (o.kind === "fetch") await this.feed(pid, await this.peers.get(pid).data(this.ds));
    }
  }

  nextNo(pid) {
    const no = this.msgNo.get(pid) || 0;
    this.msgNo.set(pid, no + 1);
    return no;
  }

  async record(from, to, frames) {
    const r = new W.Reassembler();
    let m = null;
    for (const f of frames) m = r.feed(f);
    this.out.push(["send", from, to, ...(await normMessage(m))]);
  }

  push(from, to, frames) {
    if (this.dead.has(to) || this.dead.has(from) || !this.peers.has(to)) return; // dead, or a stranger: nobody reads it
    this.wire.push([from, to, frames, this.sim ? this.sim.messageDue(from, to) : 0]);
  }

  deliverable() {
    const i = this.wire.findIndex(([a, b]) => this.links.get(`${a}>${b}`) !== 0);
    return i < 0 ? null : i;
  }

  async deliverOne(index = null) {
    const [[sender, to, frames]] = this.wire.splice(index ?? this.deliverable(), 1);
    const link = `${sender}>${to}`;
    if (this.links.has(link)) this.links.set(link, this.links.get(link) - 1);
    const peer = this.peers.get(to);
    const key = `${sender}>${to}`;
    if (!this.reasm.has(key)) this.reasm.set(key, new W.Reassembler());
    const r = this.reasm.get(key);
    let m = null;
    let msg;
    try {
      for (const f of frames) m = r.feed(f);
      const tr = peer.trainer;
      msg = await W.fromMessage(m, tr ? tr.totalSize : null, tr ? tr.stateSizes : null);
    } catch (err) {
      this.reasm.delete(key);
      const n = this.out.length;
      await this.feed(to, await peer.badMessage(sender, err.message));
      for (const o of this.out.slice(n)) { // each side words its frame errors (tests/test_frames_*)
        if (o[0] === "log" || o[0] === "alarm") o[o.length - 1] = o[o.length - 1].replace(err.message, "<frame error>");
      }
      return;
    }
    await this.feed(to, await peer.receive(sender, msg, m.runId));
  }

  async computeOne(only = null, index = null) {
    const i = index ?? this.computes.findIndex(([pid]) => !this.held.has(pid) && (only === null || pid === only));
    if (i < 0) return false;
    const [pid, c] = this.computes.splice(i, 1)[0];
    const peer = this.peers.get(pid);
    const res = await contributeAt(peer.trainer, c.theta, c.step, c.micro);
    if (res !== null) await this.feed(pid, await peer.computed(c.step, c.task, res, c.term ?? null)); // null: a stale round, dropped (as mesh.js)
    return true;
  }

  async settle() {
    for (let i = 0; i < MAX_ITER; i++) {
      if (this.deliverable() !== null) await this.deliverOne();
      else if (!(await this.computeOne())) return;
    }
    throw new Error("the scenario did not settle");
  }

  async makeTrainer(identity, ds) {
    return L.makeTrainer({ spec: ModelSpec.fromJson(identity.model), hyper: makeHyper(identity.hyper),
      dataset: ds, luts, units });
  }

  resolve(v, to) {
    const p = this.peers.get(to);
    if (typeof v === "string" && v.startsWith("$")) {
      return { $run: p.runId, $sha: p.trainer ? p.sha : "0".repeat(64), $term: p.term, $step: p.step,
        $identity: p.run ? p.run.identity : {}, $fingerprint: p.trainer ? p.trainer.ds.fingerprint : "0".repeat(64) }[v];
    }
    if (Array.isArray(v)) return v.map((x) => this.resolve(x, to));
    if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, this.resolve(x, to)]));
    return v;
  }

  async op(e) {
    switch (e.op) {
      case "peer": {
        const opts = { kind: e.kind ?? "python", aggregate: e.aggregate ?? "star", capacity: e.capacity ?? 1.0, verifyRate: e.verify_rate ?? 0.0,
          strikes: e.strikes ?? 3, verifyKey: e.verify_key ?? "key", waitPeers: e.wait_peers ?? 0, window: e.window ?? null,
          makeTrainer: async (identity, ds) => {
            const tr = await this.makeTrainer(identity, ds);
            // a replica whose lookup tables differ (its identity says so)
            if (e.luts_sha !== undefined) tr.luts = Object.create(tr.luts, { manifestSha256: { value: String(e.luts_sha) } });
            return tr;
          } };
        if (e.selftest) opts.selftest = [Boolean(e.selftest[0]), String(e.selftest[1])];  // [passed, text]
        const p = new RunPeer(e.id, opts);
        if (e.host) p._hostSteps = e.steps ?? input.steps;
        this.peers.set(e.id, p);
        if (e.fault) this.faults.set(e.id, e.fault);
        break;
      }
      case "room":
        this.host = e.host;
        for (const pid of [...(e.only ?? e.members)].sort()) {
          if (!this.dead.has(pid)) await this.feed(pid, await this.peers.get(pid).setMembers(e.members, e.host));
        }
        break;
      case "link":
        for (let i = 0; i < e.peers.length; i++) {
          for (const b of e.peers.slice(i + 1)) {
            const a = e.peers[i];
            await this.feed(a, await this.peers.get(a).channelOpen(b));
            await this.feed(b, await this.peers.get(b).channelOpen(a));
          }
        }
        break;
      case "start": {
        const p = this.peers.get(e.id);
        const tr = await this.makeTrainer(input.identity, this.ds);
        const identity = T.runIdentity(tr.spec, tr.hp, this.ds, luts);
        const id = await T.runId(identity);
        await this.feed(e.id, await p.hostRun(tr, identity, id, p._hostSteps, e.now ?? (this.sim ? this.sim.now / 1000 : 0)));
        break;
      }
      case "run": await this.settle(); break;
      case "sim": await this.simulate(e); break;
      case "deliver":
        for (let i = 0; i < MAX_ITER && this.deliverable() !== null; i++) await this.deliverOne();
        break;
      case "compute":
        for (let i = 0; i < (e.count ?? MAX_ITER); i++) if (!(await this.computeOne(e.id ?? null))) break;
        break;
      case "hold": this.held.add(e.id); break;
      case "release": this.held.delete(e.id); break;
      case "hold_link": this.links.set(`${e.from}>${e.to}`, e.after ?? 0); break;
      case "release_link": this.links.delete(`${e.from}>${e.to}`); break;
      case "tick":
        for (const pid of this.live()) await this.feed(pid, await this.peers.get(pid).tick(e.now));
        break;
      case "kill": {
        this.dead.add(e.id);
        this.wire = this.wire.filter(([a, b]) => a !== e.id && b !== e.id);
        this.computes = this.computes.filter(([pid]) => pid !== e.id);
        if (this.sim) this.sim.busy.delete(e.id);
        for (const other of this.live()) await this.feed(other, await this.peers.get(other).channelClosed(e.id));
        if ("host" in e) await this.op({ op: "room", members: this.live(), host: e.host });
        break;
      }
      case "inject": await this.inject(e); break;
      case "snapshot": {
        const tr = this.peers.get(e.id).trainer;
        this.snapshots.set(e.name, { step: tr.step, theta: tr.theta.slice(), m: tr.adam.m.slice(), v: tr.adam.v.slice(),
          b1t: tr.adam.b1t, b2t: tr.adam.b2t });
        break;
      }
      case "restore": {
        const s = this.snapshots.get(e.name);
        const st = { ...s, theta: s.theta.slice(), m: s.m.slice(), v: s.v.slice() };
        await this.feed(e.id, await this.peers.get(e.id).restore(st, this.peers.get(e.id).now));
        break;
      }
      default: throw new Error(`unknown op ${e.op}`);
    }
  }

  /** scenario_net.py simulate: the room on the virtual clock until every live replica ended
   * (or was refused) and every timed op ran, or until_ms passed (a hang). */
  async simulate(e) {
    const s = (this.sim = new Sched(e));
    const at = e.at ?? [];
    let k = 0;
    const tickMs = e.tick_ms ?? 100;
    let nextTick = tickMs;
    const exitMs = e.removed_exit_ms ?? null;
    const exits = []; // [due ms, peer]: a removed replica exits (as a daisy-peer does when told)
    let seen = 0;
    const earliest = (list, ok, due) => {
      let best = null;
      list.forEach((x, i) => { if (ok(x) && (best === null || due(x) < best[0])) best = [due(x), i]; });
      return best;
    };
    for (;;) {
      if (exitMs) {
        for (const o of this.out.slice(seen)) {
          if (o[0] === "removed" && !this.dead.has(o[1]) && exits.every((x) => x[1] !== o[1])) exits.push([s.now + s.draw(...exitMs), o[1]]);
        }
        seen = this.out.length;
      }
      if (k === at.length && this.live().every((q) => { const p = this.peers.get(q); return !p.trainer || p.ended || p.refused; })) {
        this.out.push(["sim", "end", s.now]);
        break;
      }
      const tOp = k < at.length ? at[k][0] : null;
      const tExit = exits.length ? Math.min(...exits.map((x) => x[0])) : null;
      const msg = earliest(this.wire, (w) => this.links.get(`${w[0]}>${w[1]}`) !== 0, (w) => w[3]);
      const cmp = earliest(this.computes, (c) => !this.held.has(c[0]), (c) => c[2]);
      const t = Math.min(...[tOp, tExit, msg && msg[0], cmp && cmp[0], nextTick].filter((x) => x !== null));
      if (t > e.until_ms) {
        this.out.push(["sim", "hang", s.now]);
        break;
      }
      s.now = t;
      for (const q of this.live()) { const p = this.peers.get(q); p.now = Math.max(p.now, t / 1000); }
      if (t === tOp) {
        k += 1;
        await this.op(at[k - 1][1]);
      } else if (t === tExit) {
        const x = exits.reduce((a, b) => (b[0] < a[0] || (b[0] === a[0] && b[1] < a[1]) ? b : a));
        exits.splice(exits.indexOf(x), 1);
        await this.op({ op: "kill", id: x[1], host: this.host });
      } else if (msg !== null && t === msg[0]) await this.deliverOne(msg[1]);
      else if (cmp !== null && t === cmp[0]) await this.computeOne(null, cmp[1]);
      else {
        nextTick += tickMs;
        for (const q of this.live()) await this.feed(q, await this.peers.get(q).tick(t / 1000));
      }
    }
    this.sim = null;
  }

  async inject(e) {
    const { from, to } = e;
    const meta = this.resolve(e.meta ?? {}, to);
    const runId = this.resolve(e.run_id ?? "$run", to);
    const step = this.resolve(e.step ?? "$step", to);
    const type = W.FrameType[(e.type ?? "control").toUpperCase()];
    let body = new Uint8Array(0);
    let codec = 0;
    if (e.ints) {
      const p = this.peers.get(to);
      const res = await contributeAt(p.trainer, p.trainer.theta.slice(), step, e.ints.micro);
      let ints = res.grad;
      if (e.ints.fault) ints = corrupt(ints, e.ints.fault, step);
      if (e.ints.slice) ints = ints.slice(e.ints.slice[0], e.ints.slice[1]); // a ring chunk: values [lo, hi)
      if (e.ints.set) { // [index, value]: "bound+1" / "-bound-1" (the clamp bound of its micro-batches), or an integer string
        const [i, v] = e.ints.set;
        const bound = e.ints.micro.length * p.trainer.limit;
        ints = Float64Array.from(ints);
        ints[i] = v === "bound+1" ? bound + 1 : v === "-bound-1" ? -bound - 1 : Number(v);
      }
      if (e.ints.codec === "RAW") { // as written, past every encoder check
        codec = W.Codec.RAW;
        body = new Uint8Array(8 * ints.length);
        const dv = new DataView(body.buffer);
        for (let i = 0; i < ints.length; i++) dv.setBigInt64(8 * i, BigInt(ints[i]), true);
      } else {
        ({ codec, body } = W.encodeInts(ints, e.ints.slice ? null : p.bounds));
      }
    }
    let msgType = type;
    let msgMeta = meta;
    if (e.state) { // the receiver's own state, under the step given (a STATE nobody asked for)
      const st = await this.peers.get(to).member.state();
      const vals = [...st.theta, ...st.m, ...st.v, st.b1t, st.b2t];
      body = new Uint8Array(8 * vals.length);
      const dv = new DataView(body.buffer);
      vals.forEach((x, i) => dv.setFloat64(8 * i, x, true));
      msgType = W.FrameType.STATE;
      msgMeta = { params_sha256: st.params_sha256 };
    }
    const no = this.nextNo(from);
    let frames;
    if (e.meta_raw === undefined) {
      frames = W.encodeFrames({ type: msgType, runId, step, meta: msgMeta, body, codec }, no);
      await this.record(from, to, frames);
    } else { // hostile meta bytes, as written
      const raw = new TextEncoder().encode(e.meta_raw);
      frames = W.encodeFrames({ type, runId, step, meta: {}, body, codec }, no);
      const payload = new Uint8Array(4 + raw.length + body.length);
      new DataView(payload.buffer).setUint32(0, raw.length, true);
      payload.set(raw, 4);
      payload.set(body, 4 + raw.length);
      const f = new Uint8Array(W.HEADER_SIZE + payload.length);
      f.set(frames[0].subarray(0, W.HEADER_SIZE));
      new DataView(f.buffer).setUint32(32, payload.length, true);
      f.set(payload, W.HEADER_SIZE);
      frames = [f];
      this.out.push(["send-raw", from, to, bodySha(f)]);
    }
    this.push(from, to, frames);
  }
}

/** The JS replicas of a mixed room (scenario_mixed.py): their sends are handed back as frame
 * bytes, not put on a wire; the Python side schedules every message and compute. */
class Served extends Net {
  push(from, to, frames) { this.sent.set(this.out.length - 1, frames); } // (record() wrote its send just before)
}

/** One request a line: {m: "reset", dcds, identity, steps} (a new room), {m: "op", e} (a
 * replica's peer / start / snapshot / restore op), {m: "call", id, f, a} (a RunPeer method),
 * {m: "recv", id, from, frames} (frames in base64), {m: "compute", id, h} (a compute handed
 * out before), {m: "final", id}; "now" brings the replica's clock up first. The answer:
 * {out: [{o: output, f?: frames of a send, h?: a compute's handle}], st: the replica's state}. */
async function serve() {
  const dss = new Map();
  const held = new Map();
  let net = null;
  let handle = 0;
  for await (const line of lines) {
    const q = JSON.parse(line);
    try {
      if (q.m === "reset") {
        if (!dss.has(q.dcds)) dss.set(q.dcds, await loadDs(q.dcds));
        Object.assign(input, { identity: q.identity, steps: q.steps });
        net = new Served({}, dss.get(q.dcds));
        held.clear();
        console.log("{}");
        continue;
      }
      net.out = [];
      net.sent = new Map();
      const p = net.peers.get(q.id ?? q.e?.id);
      if (p && q.now !== undefined) p.now = Math.max(p.now, q.now);
      if (q.m === "op") await net.op(q.e);
      else if (q.m === "call") await net.feed(q.id, await p[q.f](...q.a));
      else if (q.m === "recv") {
        net.wire.push([q.from, q.id, q.frames.map((f) => new Uint8Array(Buffer.from(f, "base64"))), 0]);
        await net.deliverOne(net.wire.length - 1);
      } else if (q.m === "compute") {
        net.computes.push(held.get(q.h));
        held.delete(q.h);
        await net.computeOne(null, net.computes.length - 1);
      } else if (q.m === "final") {
        console.log(JSON.stringify({ step: p.step, sha: p.trainer ? await T.paramsSha256(p.trainer.theta) : null }));
        continue;
      }
      const computes = net.computes.splice(0);
      const out = net.out.map((o, i) => {
        if (net.sent.has(i)) return { o, f: net.sent.get(i).map((f) => Buffer.from(f).toString("base64")) };
        if (o[0] !== "compute") return { o };
        held.set(++handle, computes.shift());
        return { o, h: handle };
      });
      const r = net.peers.get(q.id ?? q.e.id);
      const st = r ? { ended: !!r.ended, refused: !!r.refused, trainer: !!r.trainer, step: r.step } : null;
      console.log(JSON.stringify({ out, st }));
    } catch (err) {
      console.log(JSON.stringify({ error: `${err.stack}` }));
    }
  }
}

/** The scenarios of the input, each by a fresh Net. */
async function runAll() {
  const results = [];
  const ds = await loadDs(input.dcds);
  for (const sc of input.scenarios) {
    const net = new Net(sc, ds);
    try {
      for (const e of sc.events) await net.op(e);
      const final = {};
      for (const p of net.live()) {
        const peer = net.peers.get(p);
        final[p] = { step: peer.step, sha: peer.trainer ? await T.paramsSha256(peer.trainer.theta) : null };
      }
      results.push({ name: sc.name, outputs: net.out, final });
    } catch (err) {
      results.push({ name: sc.name, error: `${err.stack}`, outputs: net.out });
    }
  }
  console.log(JSON.stringify(results));
}

await (serving ? serve() : runAll());

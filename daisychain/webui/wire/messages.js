// The typed run messages, one of the three parts of the wire format (frames.js; JS mirror
// of daisychain/peer/messages.py): a run message object (webui/run/) <-> frames, every
// meta field checked as frames.py checks it (tests/scenarios/frames.json holds both).

import { FrameError, FrameType, encodeFrames } from "./framing.js";
import { decodeInts, encodeInts } from "./intcodec.js";

// -- run messages ------------------------------------------------------------------------------

function f64Bytes(arrays, tail) {
  const n = arrays.reduce((s, a) => s + a.length, 0) + tail.length;
  const out = new Uint8Array(8 * n);
  const dv = new DataView(out.buffer);
  let k = 0;
  for (const a of [...arrays, tail]) for (let i = 0; i < a.length; i++) dv.setFloat64(8 * k++, a[i], true);
  return out;
}

/** A run message object (webui/run/) -> frames. */
export function encode(msg, runId, bounds, nextMsgNo) {
  let m;
  if (msg.T === "contrib") {
    const { codec, body } = encodeInts(msg.ints, bounds);
    m = { type: FrameType.CONTRIB, runId, step: msg.step, codec, body,
      meta: { term: msg.term, task: msg.task, micro: [...msg.micro], loss: msg.loss, correct: msg.correct } };
  } else if (msg.T === "total") {
    const { codec, body } = msg.encoded ?? encodeInts(msg.ints, bounds); // encoded once at the commit
    m = { type: FrameType.TOTAL, runId, step: msg.step, codec, body,
      meta: { term: msg.term, contributors: msg.contributors.map(([p, n]) => [p, n]), loss: msg.loss, params_sha256: msg.params_sha256 } };
    // the receiver's tasks of the next step ride on its total (peer/run / webui/run commit)
    if (msg.tasks && msg.tasks.length) m.meta.tasks = msg.tasks.map((t) => ({ task: t.task, peer: t.peer, micro: [...t.micro] }));
    for (const k of ["unchecked", "removed"]) if (msg[k] && msg[k].length) m.meta[k] = [...msg[k]]; // only when there are any
  } else if (msg.T === "state") {
    m = { type: FrameType.STATE, runId, step: msg.step, meta: { params_sha256: msg.params_sha256 },
      body: f64Bytes([msg.theta, msg.m, msg.v], [msg.b1t, msg.b2t]) };
  } else if (msg.T === "ring_chunk") { // a ring chunk (run/ring.js): no tensor segments
    const { codec, body } = encodeInts(msg.ints, null);
    m = { type: FrameType.RING, runId, step: msg.step, codec, body,
      meta: { term: msg.term, ring: msg.ring, phase: msg.phase, round: msg.round, chunk: msg.chunk } };
  } else if (msg.T === "data") {
    m = { type: FrameType.DATA, runId, step: 0, meta: { fingerprint: msg.fingerprint }, body: msg.data };
  } else {
    const meta = { t: msg.T };
    for (const [k, v] of Object.entries(msg)) {
      if (k === "T" || k === "step" || (k === "removed" && !v.length)) continue;
      meta[k] = k === "tasks" ? v.map((t) => ({ task: t.task, peer: t.peer, micro: [...t.micro] })) : v;
    }
    m = { type: FrameType.CONTROL, runId, step: msg.step ?? 0, meta };
  }
  return encodeFrames(m, nextMsgNo());
}

/** Most members of a ring (a plan's peers; messages.py MAX_RING). */
export const MAX_RING = 1024;
const need = (cond, what) => { if (!cond) throw new FrameError(what); };
const isInt = (v) => Number.isInteger(v) && v >= 0 && v <= 0xffffffff;
const isHex = (v, n = 64) => typeof v === "string" && v.length === n && /^[0-9a-f]+$/.test(v);
const isMicro = (v) => Array.isArray(v) && v.length > 0 && v.length <= 1 << 20
  && v.every((j, i) => Number.isInteger(j) && j >= 0 && j < 2 ** 31 && (i === 0 || j > v[i - 1]));
// the string and list limits of frames.py (_M.str / _M.list)
const isNum = (v) => typeof v === "number" && Math.abs(v) <= 1e300; // frames.py _M.num
const isStr = (v, n = 256) => typeof v === "string" && v.length <= n;
const isList = (v, n = 1 << 16) => Array.isArray(v) && v.length <= n;
/** An optional list of peer ids (messages.py _ids). */
const isIds = (v) => v === undefined || (isList(v, MAX_RING) && v.every((p) => typeof p === "string" && p.length > 0 && p.length <= 64));
const isTasks = (v) => isList(v) && v.every((x) => x && typeof x === "object" && isInt(x.task) && isStr(x.peer, 64) && isMicro(x.micro));

/** `msg` (a TOTAL) with `encoded`, its ints' {codec, body} as they were or will be sent, so
 *  that the ints are encoded once a step (the coordinator's commit) and the rollback window
 *  keeps the received body (messages.py Total.encoded). Not a field of the message: not
 *  enumerable, so it is not compared, copied or listed with the fields. */
export function withEncoded(msg, encoded) {
  Object.defineProperty(msg, "encoded", { value: encoded, enumerable: false });
  return msg;
}

/** A reassembled message -> a run message object; async (compressed bodies). */
export async function fromMessage(m, size = null, stateSizes = null) {
  const meta = m.meta;
  if (m.type === FrameType.CONTRIB) {
    need(isInt(meta.term) && isInt(meta.task) && isMicro(meta.micro) && isNum(meta.loss) && isInt(meta.correct), "contrib: bad meta");
    return { T: "contrib", term: meta.term, step: m.step, task: meta.task, micro: meta.micro, loss: meta.loss,
      correct: meta.correct, ints: await decodeInts(m.codec, m.body, size) };
  }
  if (m.type === FrameType.TOTAL) {
    need(isInt(meta.term) && isList(meta.contributors) && isNum(meta.loss) && isHex(meta.params_sha256), "total: bad meta");
    need(meta.contributors.every((c) => Array.isArray(c) && c.length === 2 && isStr(c[0], 64) && Number.isSafeInteger(c[1]) && c[1] >= 0), "total: bad contributors");
    need(meta.tasks === undefined || isTasks(meta.tasks), "total: bad tasks");
    need(isIds(meta.unchecked) && isIds(meta.removed), "total: bad peer ids");
    return withEncoded({ T: "total", term: meta.term, step: m.step, contributors: meta.contributors, loss: meta.loss,
      params_sha256: meta.params_sha256, ints: await decodeInts(m.codec, m.body, size), tasks: meta.tasks ?? [],
      unchecked: meta.unchecked ?? [], removed: meta.removed ?? [] }, { codec: m.codec, body: m.body });
  }
  if (m.type === FrameType.STATE) {
    need(size !== null, "state: no run to load it into");
    // theta has n values, m and v k each (a local-steps run's differ: stateSizes)
    const [n, k] = stateSizes ?? [size, size];
    need(m.body.length === 8 * (n + 2 * k) + 16, `state of ${m.body.length} bytes does not hold ${n} parameters`);
    need(isHex(meta.params_sha256), "state: bad params_sha256");
    const dv = new DataView(m.body.buffer, m.body.byteOffset, m.body.byteLength);
    const read = (at, len) => Float64Array.from({ length: len }, (_, i) => dv.getFloat64(8 * (at + i), true));
    const theta = read(0, n);
    const mm = read(n, k);
    const v = read(n + k, k);
    for (const a of [theta, mm, v]) need(a.every(Number.isFinite), "state holds non-finite values");
    return { T: "state", step: m.step, params_sha256: meta.params_sha256, theta, m: mm, v,
      b1t: dv.getFloat64(8 * (n + 2 * k), true), b2t: dv.getFloat64(8 * (n + 2 * k) + 8, true) };
  }
  if (m.type === FrameType.RING) { // its length and values are checked against the ring (run/ring.js)
    need(isInt(meta.term) && isInt(meta.ring) && (meta.phase === 0 || meta.phase === 1)
      && Number.isInteger(meta.round) && meta.round >= 0 && meta.round <= MAX_RING
      && Number.isInteger(meta.chunk) && meta.chunk >= 0 && meta.chunk <= MAX_RING, "ring chunk: bad meta");
    return { T: "ring_chunk", term: meta.term, step: m.step, ring: meta.ring, phase: meta.phase, round: meta.round,
      chunk: meta.chunk, ints: await decodeInts(m.codec, m.body, null, size ?? null) };
  }
  if (m.type === FrameType.DATA) {
    need(isHex(meta.fingerprint), "data: bad fingerprint");
    return { T: "data", fingerprint: meta.fingerprint, data: m.body.slice() };
  }
  const t = meta.t;
  const out = { T: t, step: m.step };
  const copy = (keys) => { for (const k of keys) out[k] = meta[k]; };
  if (t === "run") {
    need(meta.identity && typeof meta.identity === "object" && !Array.isArray(meta.identity) && isHex(meta.run_id, 16)
      && isInt(meta.steps) && isInt(meta.term) && isHex(meta.params_sha256) && isStr(meta.coordinator, 64), "run: bad meta");
    // spot-checks (peer/run/): absent means none (an older peer), as frames.py reads it
    need(meta.verify_rate === undefined || (typeof meta.verify_rate === "number" && meta.verify_rate >= 0 && meta.verify_rate <= 1), "run: bad verify_rate");
    need(meta.strikes === undefined || (Number.isInteger(meta.strikes) && meta.strikes >= 1 && meta.strikes <= 1000), "run: bad strikes");
    need(isIds(meta.removed), "run: bad removed");
    copy(["identity", "run_id", "steps", "term", "params_sha256", "coordinator"]);
    out.verify_rate = meta.verify_rate ?? 0.0;
    out.strikes = meta.strikes ?? 3;
    out.removed = meta.removed ?? [];
  } else if (t === "ready") {
    need(isInt(meta.term) && typeof meta.capacity === "number" && meta.capacity >= 1e-3 && meta.capacity <= 1e9
      && isStr(meta.kind, 16) && isHex(meta.params_sha256), "ready: bad meta");
    copy(["term", "capacity", "kind", "params_sha256"]);
  } else if (t === "refuse") {
    need(isInt(meta.term) && isList(meta.reasons, 64) && meta.reasons.every((r) => isStr(r, 1000)), "refuse: bad meta");
    copy(["term", "reasons"]);
  } else if (t === "assign") {
    need(isInt(meta.term) && isTasks(meta.tasks), "assign: bad meta");
    copy(["term", "tasks"]);
  } else if (t === "sync") {
    need(isInt(meta.term) && isHex(meta.params_sha256) && isStr(meta.reason, 1000), "sync: bad meta");
    copy(["term", "params_sha256", "reason"]);
  } else if (t === "data_request") {
    need(isHex(meta.fingerprint), "data_request: bad meta");
    copy(["fingerprint"]);
  } else if (t === "restore") {
    need(isInt(meta.term) && isHex(meta.params_sha256), "restore: bad meta");
    copy(["term", "params_sha256"]);
  } else if (t === "end") {
    need(isInt(meta.term) && isHex(meta.params_sha256), "end: bad meta");
    copy(["term", "params_sha256"]);
  } else if (t === "ring_plan") {
    need(isInt(meta.term) && isInt(meta.ring) && isTasks(meta.tasks), "ring_plan: bad meta");
    need(isList(meta.peers, MAX_RING) && meta.peers.length >= 2 && meta.peers.every((p) => typeof p === "string" && p.length > 0 && p.length <= 64)
      && new Set(meta.peers).size === meta.peers.length, "ring_plan: 'peers' must be 2 or more distinct peer ids");
    copy(["term", "ring", "peers", "tasks"]);
  } else if (t === "ring_sum") {
    need(isInt(meta.term) && isInt(meta.ring) && isMicro(meta.micro) && isNum(meta.loss) && isInt(meta.correct), "ring_sum: bad meta");
    copy(["term", "ring", "micro", "loss", "correct"]);
  } else if (t === "ring_commit") {
    need(isInt(meta.term) && isInt(meta.ring) && isList(meta.contributors) && isNum(meta.loss) && isHex(meta.params_sha256), "ring_commit: bad meta");
    need(meta.contributors.every((c) => Array.isArray(c) && c.length === 2 && isStr(c[0], 64) && Number.isSafeInteger(c[1]) && c[1] >= 0), "ring_commit: bad contributors");
    copy(["term", "ring", "contributors", "loss", "params_sha256"]);
  } else {
    throw new FrameError(`unknown control message '${String(t).slice(0, 32)}'`); // as messages.py writes it (repr of a plain name)
  }
  return out;
}

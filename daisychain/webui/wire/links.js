// The room's connectivity matrix: every member shares the state and round-trip time of its own
// direct links (network.js sends them about once a second through the signaling server's
// `broadcast`), and every tab puts the rows together. No DOM, no sockets: plain data, and the
// checks for what arrives from others (only members' ids, only known states, finite numbers;
// everything else is dropped).
//
//   payload: {type: "links", v: 1, rows: {peerId: {state, rttMs}}, report?: {runId, step, sha}}
//
// `report` is the sender's params hash after a step (mesh.js compares it with its own: the
// peers table's "hash agrees").

export const LINK_STATES = Object.freeze(["new", "connecting", "open", "failed", "closed"]);
export const LINKS_TYPE = "links";
/** A row not heard from for this long is dropped from the matrix. */
export const STALE_S = 10;
/** At most this many entries in one row (a room larger than this shows the first ones). */
export const MAX_ROW = 128;
const MAX_RTT_MS = 600_000;
const ID_RE = /^[0-9a-zA-Z_-]{1,64}$/;
const HEX64 = /^[0-9a-f]{64}$/;
const RUN_ID = /^[0-9a-f]{16}$/;

/** The contract's link state of an RTCPeerConnection state and its data channel's. */
export function linkState(connectionState, channelOpen) {
  if (channelOpen) return "open";
  switch (connectionState) {
    case "new": return "new";
    case "failed": return "failed";
    case "closed": return "closed";
    default: return "connecting"; // "connecting", "connected" (channel not yet open), "disconnected"
  }
}

/** A round-trip time in ms, or null when it is not a finite, sane number. */
export function cleanRtt(v) {
  return typeof v === "number" && Number.isFinite(v) && v >= 0 && v <= MAX_RTT_MS ? v : null;
}

/** The payload this tab sends: its own rows ({id: {state, rttMs}}) and its last report. */
export function linksPayload(rows, report = null) {
  const out = {};
  for (const [id, r] of Object.entries(rows).slice(0, MAX_ROW)) out[id] = { state: r.state, rttMs: r.rttMs === null ? null : Math.round(r.rttMs * 10) / 10 };
  const p = { type: LINKS_TYPE, v: 1, rows: out };
  if (report) p.report = { runId: report.runId, step: report.step, sha: report.sha };
  return p;
}

/**
 * Check a payload from `sender` against the room's member ids: {rows, report} with only
 * members' ids (not the sender's own), known states and finite round-trip times, and a
 * report only when every field is well formed; null when it is no links payload at all.
 */
export function parseLinks(data, sender, members) {
  if (!data || typeof data !== "object" || Array.isArray(data) || data.type !== LINKS_TYPE) return null;
  const known = new Set(members);
  if (!known.has(sender)) return null;
  const rows = {};
  const raw = data.rows;
  if (raw && typeof raw === "object" && !Array.isArray(raw)) {
    let n = 0;
    for (const [id, r] of Object.entries(raw)) {
      if (n >= MAX_ROW) break;
      if (id === sender || !known.has(id) || !ID_RE.test(id)) continue;
      if (!r || typeof r !== "object" || !LINK_STATES.includes(r.state)) continue;
      rows[id] = { state: r.state, rttMs: cleanRtt(r.rttMs) };
      n += 1;
    }
  }
  let report = null;
  const rp = data.report;
  if (rp && typeof rp === "object" && typeof rp.runId === "string" && RUN_ID.test(rp.runId)
      && Number.isSafeInteger(rp.step) && rp.step >= 0 && typeof rp.sha === "string" && HEX64.test(rp.sha)) {
    report = { runId: rp.runId, step: rp.step, sha: rp.sha };
  }
  return { rows, report };
}

/** Every member's last reported row, kept to the members of the room. */
export class LinkMatrix {
  constructor() {
    this.members = [];
    this.rows = new Map();    // id -> {rows, at}
    this.reports = new Map(); // id -> {runId, step, sha}
  }

  setMembers(ids) {
    this.members = [...ids];
    const keep = new Set(ids);
    for (const id of [...this.rows.keys()]) if (!keep.has(id)) this.rows.delete(id);
    for (const id of [...this.reports.keys()]) if (!keep.has(id)) this.reports.delete(id);
  }

  /** This tab's own row (already clean). */
  setOwn(me, rows, now) { if (this.members.includes(me)) this.rows.set(me, { rows, at: now }); }

  /** A payload from another member; returns whether it was taken. */
  receive(sender, data, now) {
    const parsed = parseLinks(data, sender, this.members);
    if (!parsed) return false;
    this.rows.set(sender, { rows: parsed.rows, at: now });
    if (parsed.report) this.reports.set(sender, parsed.report);
    return true;
  }

  /** {members, matrix: {a: {b: {state, rttMs}}}, reports} of the rows heard within STALE_S. */
  view(now) {
    const matrix = {};
    for (const [id, r] of this.rows) {
      if (now - r.at > STALE_S) {
        this.rows.delete(id);
        continue;
      }
      matrix[id] = { ...r.rows };
    }
    return { members: [...this.members], matrix, reports: Object.fromEntries(this.reports) };
  }
}

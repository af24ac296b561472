// The peers table and the matrix of links between every pair.
// A panel of the page: it subscribes to what it shows, owns its part of the DOM and reads the
// store (store.js).

import * as F from "../ui_format.js";
import { $, kindName, nameOf, state } from "./store.js";

export class PeersPanel {
  constructor(bus) {
    const both = () => { renderPeers(); renderMatrix(); };
    for (const ev of ["peer:open", "peer:close", "peer:state", "links", "page:room"]) bus.on(ev, both);
    bus.on("room:links", () => renderMatrix());
    bus.on("page:run", () => renderPeers());
  }
}

// -- peers, links, the matrix ------------------------------------------------------------------

export function linkOf(id) {
  const row = state.linkRows[id];
  // the link events (peer:open/close/state) are the fresher; `links` adds the round trip
  return { state: state.links[id] || row?.state || "connecting", rttMs: row?.rttMs ?? null };
}

export function shareText(id, row) {
  if (row && Number.isFinite(row.share)) {
    return row.share <= 1 ? `${Math.round(100 * row.share)}%` : String(row.share);
  }
  const shares = state.run.shares || {};
  const total = Object.values(shares).reduce((a, b) => a + b, 0);
  return shares[id] !== undefined && total
    ? `${shares[id]} of ${total} (${Math.round((100 * shares[id]) / total)}%)` : "—";
}

export const PEER_COLUMNS = ["Name", "Device", "Capacity", "Link", "Round trip", "Share of the step", "Micro-batches done", "Params hash"];

function renderPeers() {
  const tb = $("peers");
  tb.replaceChildren();
  const r = state.room;
  if (!r) return;
  const rows = Object.fromEntries((state.roomPeers?.rows || []).map((p) => [p.id, p]));
  for (const m of r.members) {
    const p = rows[m.id] || {};
    const tr = document.createElement("tr");
    tr.dataset.peer = m.id;
    if (m.id === r.you) tr.classList.add("me");
    if (m.host) tr.classList.add("host");
    const me = m.id === r.you;
    const link = me ? { state: "—", rttMs: null } : linkOf(m.id);
    const cap = p.capacity ?? m.capacity;
    const local = p.onModel ? state.roomPeers?.local : null; // a local-steps run's capacities are in its tasks
    const capText = `${local ? F.roundRate(cap, local.syncEvery) : F.rate(cap, state.runMicro || 16)}` +
      `${p.onModel ? " on the run's model" : " (self-test probe)"}` +
      (Number.isFinite(p.inTasks) ? `; ${p.inTasks.toFixed(1)}/s in its tasks so far, the link included` : "");
    const micro = p.micro ?? state.run.done?.[m.id] ?? 0;
    const hash = p.hashAgrees === true ? "agrees" : p.hashAgrees === false ? "differs" : "—";
    const cells = [p.name || m.name, kindName(p.kind || m.kind),
      capText, link.state,
      Number.isFinite(link.rttMs) ? `${Math.round(link.rttMs)} ms` : "—", shareText(m.id, rows[m.id]),
      F.count(micro), hash];
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      td.textContent = text;
      td.dataset.label = PEER_COLUMNS[i];
      if (i === 3) td.className = `state-${link.state}`;
      if (i === 7) td.className = `state-${hash}`;
      tr.appendChild(td);
    });
    tb.appendChild(tr);
  }
  renderPooled();
}

function renderMatrix() {
  const t = $("link-matrix");
  t.replaceChildren();
  const r = state.room;
  const ids = state.matrix?.members?.length ? state.matrix.members : (r?.members || []).map((m) => m.id);
  if (!r || ids.length < 2) {
    $("matrix-hint").textContent = "Once two devices are in the room, every pair's direct link shows here.";
    return;
  }
  $("matrix-hint").textContent = "Each cell: the direct link between the row's device and the column's (open, connecting, failed) and its round trip.";
  const cell = (a, b) => {
    const m = state.matrix?.matrix;
    const c = m?.[a]?.[b] || m?.[b]?.[a];
    if (c) return c;
    if (a === state.id) return linkOf(b);
    if (b === state.id) return linkOf(a);
    return { state: "unknown", rttMs: null };
  };
  const head = document.createElement("tr");
  head.appendChild(document.createElement("th"));
  for (const b of ids) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = nameOf(b) === "you" ? `${state.names[b] || "you"} (you)` : nameOf(b);
    head.appendChild(th);
  }
  const thead = document.createElement("thead");
  thead.appendChild(head);
  const tbody = document.createElement("tbody");
  for (const a of ids) {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.scope = "row";
    th.textContent = nameOf(a) === "you" ? `${state.names[a] || "you"} (you)` : nameOf(a);
    tr.appendChild(th);
    for (const b of ids) {
      const td = document.createElement("td");
      td.dataset.a = a;
      td.dataset.b = b;
      if (a === b) {
        td.className = "self";
        td.textContent = "—";
      } else {
        const c = cell(a, b);
        td.dataset.state = c.state;
        td.className = `state-${c.state}`;
        td.textContent = Number.isFinite(c.rttMs) ? `${c.state}, ${Math.round(c.rttMs)} ms` : c.state;
      }
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
  }
  t.append(thead, tbody);
}

function renderPooled() {
  const rp = state.roomPeers;
  let pooled = rp?.pooledCapacity;
  if (!Number.isFinite(pooled) && state.room) pooled = state.room.members.reduce((a, m) => a + (m.capacity || 0), 0);
  const local = rp?.pooledOnModel ? rp.local : null; // a local-steps run's capacities are in its tasks
  $("pooled").textContent = !Number.isFinite(pooled) ? "—"
    : (local ? `${pooled.toFixed(2)} replica rounds/s` : `${pooled.toFixed(1)} micro-batches/s`) +
    (rp?.pooledOnModel ? " on the run's model (each device measured it when the run started)"
      : " on the self-test's probe (the digits model); measured again on the run's model when a run starts");
}

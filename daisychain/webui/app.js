// The page (index.html): DOM only. It shows what network.js and mesh.js report on the bus
// and turns the user's clicks into calls on them; it never touches RTCPeerConnection.
//
// Every event it renders may never come (an older mesh.js, a peer that left): each part of
// the page falls back to what it can work out from the events it has (bus.js lists them).
//
// window.__daisy exposes the page's state for tests and curious users (read-only use).

import { bus } from "./bus.js";
import { Chart } from "./chart.js";
import { exportCheckpoint, importCheckpoint, settingsOf } from "./checkpoint.js";
import { makeHyper, ModelSpec, parseLayers } from "./engine/spec.js";
import { Mesh, selfTestDevice } from "./mesh.js";
import { Network } from "./network.js";
import { normalizeRoom, roomFromLocation } from "./protocol.js";
import { TryPanel } from "./panels/try.js";
import * as F from "./ui_format.js";
import { createTrainer } from "./worker/trainer_proxy.js";

const $ = (id) => document.getElementById(id);

const state = {
  ready: false,        // self-test done and connected to the server
  device: null,        // {name, kind, capacity, reason, paths}
  id: null,
  room: null,          // {room, code, host, members, isHost}
  pending: null,       // {code} while waiting for approval
  denied: null,        // the host's refusal, in words
  error: null,         // the last error, in words
  requests: [],        // join requests (host only)
  links: {},           // peer id -> "open" | "closed" | connection state
  names: {},           // every device id seen -> its name (also after it left)
  run: { state: "idle", step: 0, steps: null, loss: null, sha: null, runId: null, shares: {}, done: {}, accuracy: null },
  refusals: [],        // {peer, message}: devices that declined the run, and why
  checkpoint: { busy: false, loaded: null, saved: [], restores: [], error: null, info: null },
  share: { links: [], note: "", chosen: 0, copied: false, code: null },
  datasets: [],        // GET /datasets entries
  datasetsLoaded: false, // GET /datasets answered (or failed: the embedded sets only)
  maxUpload: null,     // bytes, from GET /datasets
  upload: null,        // the last uploaded entry
  counters: null,      // {multiply, requantize, relu, micro}
  counterSteps: [],    // counters.micro of every counters event of this run, in order
  roomPeers: null,     // room:peers detail
  linkRows: {},        // id -> {state, rttMs} (this tab's links, from `links`)
  matrix: null,        // room:links detail
  preparing: null,     // {stage, done, total}
  times: [],           // [seconds, step] of committed steps of this run
  runStart: null,      // {t, step} when this run began here
  chart: { loss: [], accuracy: [] },
  fieldErrors: {},
  announcements: [],
  end: null,           // the end card's numbers
  events: [],
};
window.__daisy = state;

const now = () => performance.now() / 1000;

/** Learn a device's name (this device's own is its device name, never "you"). */
function learnName(id, name) {
  if (!id || !name || (id === state.id && name === "you")) return;
  state.names[id] = name;
}

function nameOf(id) {
  if (!id) return "someone";
  if (id === state.id) return "you";
  return state.room?.members.find((m) => m.id === id)?.name || state.names[id] || "a device that left";
}

/** Text from the mesh with device ids put in words. */
function words(text) {
  return F.namesForIds(text, state.names);
}

function event(text, cls = "") {
  text = words(text);
  state.events.push(text);
  console.log(`[daisy] ${text}`);
  const li = document.createElement("li");
  const t = document.createElement("time");
  t.textContent = new Date().toLocaleTimeString();
  li.append(t, ` — ${text}`);
  if (cls) li.className = cls;
  const ol = $("events");
  ol.appendChild(li);
  while (ol.children.length > 200) ol.firstChild.remove();
  ol.scrollTop = ol.scrollHeight;
}

/** Said to this device in a banner at the top (and in the event list). */
function announce(text, key = text) {
  if (state.announcements.some((a) => a.key === key)) return;
  text = words(text);
  state.announcements.push({ key, text });
  const el = $("announce");
  el.textContent = text;
  el.hidden = false;
  event(text, "loud");
}

function status(text, isError = false) {
  $("status").textContent = words(text);
  $("status").classList.toggle("error", isError);
}

function showError(id, text) {
  const el = $(id);
  el.textContent = text ? words(text) : "";
  el.hidden = !text;
}

function defaultName() {
  const saved = localStorage.getItem("daisychain.name");
  if (saved) return saved;
  const ua = navigator.userAgent;
  const os = /Android/.test(ua) ? "Android" : /iPhone|iPad/.test(ua) ? "iOS" : /Mac/.test(ua) ? "Mac"
    : /Windows/.test(ua) ? "Windows" : /Linux/.test(ua) ? "Linux" : "Device";
  return `${os} ${Math.floor(Math.random() * 900 + 100)}`;
}

function kindName(kind) {
  return { webgpu: "WebGPU tab", cpu: "CPU tab", python: "daisy-peer (Python)" }[kind] || kind || "—";
}

const running = () => ["starting", "running"].includes(state.run.state);

// -- this device -------------------------------------------------------------------------------

/** A plain-http page on a LAN address is no secure context: say that, not "navigator.gpu is missing". */
function deviceReason(d) {
  if (window.isSecureContext || d.kind === "webgpu") return d.reason;
  const why = `WebGPU needs a secure context (https, or http on localhost) and this page was opened over plain http on ${location.host}`;
  const replaced = d.reason.replace(/this browser has no WebGPU \(navigator\.gpu is missing\)/, why);
  return replaced === d.reason ? `${why}; ${d.reason}` : replaced;
}

function renderDevice() {
  const d = state.device;
  if (!d) return;
  $("device-kind").textContent = d.kind === "webgpu" ? "WebGPU (the WGSL unit kernels)" : "CPU (the JS units)";
  $("device-reason").textContent = F.plainReason(deviceReason(d));
  $("device-capacity").textContent = F.rate(d.capacity);
  renderChecklist();
}

// -- the room and sharing it ------------------------------------------------------------------

function roomLink(code) {
  const url = new URL(location.href);
  url.search = `?room=${code}`;
  url.hash = "";
  return url.toString();
}

function renderCode(el, code) {
  el.replaceChildren();
  const groups = F.codeGroups(code);
  if (!groups.length || !/-/.test(code)) {
    el.textContent = code || "—";
    return;
  }
  el.setAttribute("aria-label", code.split("").join(" "));
  groups.forEach((g, i) => {
    if (i) {
      const s = document.createElement("span");
      s.className = "sep";
      s.textContent = "-";
      el.appendChild(s);
    }
    const span = document.createElement("span");
    span.className = "group";
    span.textContent = g;
    el.appendChild(span);
  });
}

function renderRoom() {
  const r = state.room;
  const waiting = !!state.pending;
  $("waiting").hidden = !waiting;
  if (waiting) {
    $("waiting-text").textContent = `You asked to join room ${state.pending.code}. ` +
      "The host sees your device and decides; this page continues by itself once you are let in.";
    renderCode($("room-code"), state.pending.code);
    $("room-info").textContent = "Waiting for approval.";
  } else if (state.denied && !r) {
    $("room-info").textContent = "Not let in: the host declined. Ask again, or create a room of your own.";
  } else if (r) {
    const n = r.members.length;
    const hostName = r.isHost ? "you are the host" : `${nameOf(r.host)} is the host`;
    $("room-info").textContent = r.room === "private"
      ? `Private room — ${n} device${n === 1 ? "" : "s"}, ${hostName}.`
      : `Network room: the devices on your network — ${n} here, ${hostName}.`;
    if (r.code) renderCode($("room-code"), r.code);
    else $("room-code").textContent = "network room (no code)";
  }
  $("denied-row").hidden = !(state.denied && !r && !waiting);
  renderAskAgain();
  const code = !waiting && r?.room === "private" ? r.code : null;
  $("share-box").hidden = !code;
  if (code && state.share.code !== code) loadShare(code);
  const host = !!r?.isHost;
  $("approvals-panel").hidden = !(host && r.room === "private");
  renderApprovals();
  renderPeers();
  renderMatrix();
  renderSettings();
  renderChecklist();
}

/** "Ask to join again", counting down while the server's cool-down after a refusal lasts. */
function renderAskAgain() {
  const left = state.denied ? Math.ceil(state.denied.until - now()) : 0;
  $("ask-again").disabled = left > 0;
  $("ask-again").textContent = left > 0 ? `Ask to join again (in ${left} s)` : "Ask to join again";
  if (left > 0) {
    clearTimeout(renderAskAgain.timer);
    renderAskAgain.timer = setTimeout(renderAskAgain, 1000);
  }
}

/** The join links other devices can reach (GET /share), the QR code of the chosen one. */
async function loadShare(code) {
  state.share = { links: [{ url: roomLink(code), label: "this page's address", lan: false }], note: "",
    chosen: 0, copied: false, code };
  renderShare();
  try {
    const resp = await fetch(`/share?room=${encodeURIComponent(code)}`, { cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const body = await resp.json();
    if (state.share.code !== code) return;
    if (Array.isArray(body.links) && body.links.length) state.share.links = body.links;
    state.share.note = body.note || "";
  } catch (err) {
    console.warn(`share: /share did not answer (${err.message}); the page's own address is the link`);
  }
  renderShare();
}

function isLoopbackPage() {
  const h = location.hostname.replace(/^\[|\]$/g, "");
  return h === "localhost" || h.endsWith(".localhost") || /^127\./.test(h) || h === "::1";
}

function renderShare() {
  const s = state.share;
  if (!s.code) return;
  const link = s.links[Math.min(s.chosen, s.links.length - 1)];
  const a = $("room-link");
  a.textContent = link.url;
  a.href = link.url;
  const origin = new URL(link.url).origin;
  const src = `/share/qr.svg?room=${encodeURIComponent(s.code)}&origin=${encodeURIComponent(origin)}`;
  if ($("room-qr").getAttribute("src") !== src) $("room-qr").src = src;
  $("room-qr").alt = `QR code of ${link.url}`;
  const sel = $("share-choice");
  $("share-choice-row").hidden = s.links.length < 2;
  sel.replaceChildren(...s.links.map((l, i) => {
    const o = document.createElement("option");
    o.value = String(i);
    o.textContent = `${l.label} — ${new URL(l.url).host}`;
    return o;
  }));
  sel.value = String(s.chosen);
  const notes = [];
  if (isLoopbackPage() && s.links.some((l) => l.lan)) {
    notes.push("You opened this page on localhost, which other devices cannot reach: the link and the QR code use this machine's LAN address.");
  } else if (isLoopbackPage() && !s.note) notes.push("You opened this page on localhost, which other devices cannot reach.");
  if (s.note) notes.push(s.note);
  else if (s.links.some((l) => l.lan)) {
    notes.push("A page opened on a LAN address over plain http trains on the JS units (browsers keep WebGPU for secure contexts: https or localhost).");
  }
  $("share-note").textContent = notes.join(" ");
  $("share-link").hidden = typeof navigator.share !== "function";
}

function renderApprovals() {
  const ul = $("approvals");
  ul.replaceChildren();
  const list = state.room?.pending || [];
  if (!list.length) {
    const li = document.createElement("li");
    li.className = "hint";
    li.textContent = "Nobody is waiting.";
    ul.appendChild(li);
    return;
  }
  for (const dev of list) {
    state.names[dev.id] = dev.name;
    const li = document.createElement("li");
    li.dataset.peer = dev.id;
    const label = document.createElement("span");
    label.textContent = `${dev.name} — ${kindName(dev.kind)}, ${F.rate(dev.capacity)}`;
    const yes = document.createElement("button");
    yes.className = "approve";
    yes.type = "button";
    yes.textContent = "Approve";
    yes.setAttribute("aria-label", `Approve ${dev.name}`);
    yes.onclick = () => { net.approve(dev.id); event(`you let ${dev.name} in`); };
    const no = document.createElement("button");
    no.className = "deny";
    no.type = "button";
    no.textContent = "Deny";
    no.setAttribute("aria-label", `Deny ${dev.name}`);
    no.onclick = () => { net.deny(dev.id); event(`you declined ${dev.name}`); };
    li.append(label, yes, no);
    ul.appendChild(li);
  }
}

// -- the checklist -----------------------------------------------------------------------------

function renderChecklist() {
  const d = state.device;
  const r = state.room;
  const ready = !!d && !!r;
  const shared = !!r && (r.members.length > 1 || (r.room === "private" && state.share.copied));
  const started = ["running", "done"].includes(state.run.state) || state.run.step > 0;
  const set = (id, done, text) => {
    $(id).classList.toggle("done", done);
    $(`${id}-text`).textContent = text;
  };
  const guest = !!r && !r.isHost;
  const waitingWhy = state.pending ? "; waiting for the host to let you in" : state.denied ? "; not let in" : "; connecting…";
  set("check-ready", ready, !d ? "the self-test is running"
    : `computes on ${d.kind === "webgpu" ? "WebGPU" : "the JS units"}, ${F.rate(d.capacity)}${r ? "" : waitingWhy}`);
  set("check-share", shared || guest, state.pending ? "the host of the room decides whether you join"
    : state.denied ? "the host declined: ask again, or create a room of your own"
    : guest ? `you are in ${nameOf(r.host)}'s room`
    : !r ? "create a private room, then let others scan its code"
    : r.members.length > 1 ? `${r.members.length} devices in the room`
      : r.room === "private" ? "show the QR code or send the link; approve who asks" : "create a private room, or wait for devices on your network");
  set("check-start", started, started ? (state.run.state === "done" ? "the run is done" : "the run is going")
    : r?.isHost ? "pick the data below and press Start training" : "the host starts the run; this page follows by itself");
  const first = [["check-ready", ready], ["check-share", shared || guest], ["check-start", started]].find(([, ok]) => !ok);
  for (const id of ["check-ready", "check-share", "check-start"]) $(id).classList.toggle("now", first?.[0] === id);
}

// -- peers, links, the matrix ------------------------------------------------------------------

function linkOf(id) {
  const row = state.linkRows[id];
  // the link events (peer:open/close/state) are the fresher; `links` adds the round trip
  return { state: state.links[id] || row?.state || "connecting", rttMs: row?.rttMs ?? null };
}

function shareText(id, row) {
  if (row && Number.isFinite(row.share)) {
    return row.share <= 1 ? `${Math.round(100 * row.share)}%` : String(row.share);
  }
  const shares = state.run.shares || {};
  const total = Object.values(shares).reduce((a, b) => a + b, 0);
  return shares[id] !== undefined && total
    ? `${shares[id]} of ${total} (${Math.round((100 * shares[id]) / total)}%)` : "—";
}

const PEER_COLUMNS = ["Name", "Device", "Capacity", "Link", "Round trip", "Share of the step", "Micro-batches done", "Params hash"];

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
    const micro = p.micro ?? state.run.done?.[m.id] ?? 0;
    const hash = p.hashAgrees === true ? "agrees" : p.hashAgrees === false ? "differs" : "—";
    const cells = [p.name || m.name, kindName(p.kind || m.kind),
      F.rate(cap), link.state,
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
  $("pooled").textContent = Number.isFinite(pooled) ? `${pooled.toFixed(1)} micro-batches/s` : "—";
}

// -- settings, datasets, uploads --------------------------------------------------------------

const FIELDS = ["dataset", "data_file", "task", "steps", "layers", "hidden", "batch", "micro_batch", "lr", "seed"];

function renderSettings() {
  const host = !!state.room?.isHost && !state.pending;
  const busy = running();
  $("start").disabled = !host || busy || !state.ready;
  $("stop").disabled = !host || !busy;
  for (const el of $("settings").elements) el.disabled = !host || busy;
  renderCheckpoint();
  $("settings-hint").textContent = host
    ? "You are the host: choose the data and the model and start; every device trains the same model."
    : "The host chooses these settings and starts the run.";
}

function datasetLabel(d) {
  const size = `${F.count(d.train)} train / ${F.count(d.test)} test`;
  return `${d.name} (${d.task}, ${size})`;
}

function renderDatasets(selectFp = null) {
  const sel = $("f-dataset");
  const keep = selectFp ?? sel.value;
  sel.replaceChildren();
  if (!state.datasets.length) {
    const o = document.createElement("option");
    o.value = "";
    o.textContent = "the embedded set of the task";
    sel.appendChild(o);
    return;
  }
  const groups = { embedded: "Built in", server: "Started with the server", upload: "Sent from a device" };
  for (const [origin, label] of Object.entries(groups)) {
    const list = state.datasets.filter((d) => d.origin === origin);
    if (!list.length) continue;
    const g = document.createElement("optgroup");
    g.label = label;
    for (const d of list) {
      const o = document.createElement("option");
      o.value = d.fingerprint;
      o.textContent = d.name; // the sizes go under the list (a long option is cut in a narrow card)
      o.title = datasetLabel(d);
      g.appendChild(o);
    }
    sel.appendChild(g);
  }
  const task = $("f-task").value;
  const pick = state.datasets.find((d) => d.fingerprint === keep)
    || state.datasets.find((d) => d.origin === "embedded" && d.task === task) || state.datasets[0];
  sel.value = pick.fingerprint;
  renderDatasetInfo();
}

function renderDatasetInfo() {
  const d = chosenDataset();
  $("dataset-info").textContent = d ? `${d.task} task: ${F.count(d.train)} training and ${F.count(d.test)} test samples, ${d.classes} classes` : "";
}

function chosenDataset() {
  return state.datasets.find((d) => d.fingerprint === $("f-dataset").value) || null;
}

async function loadDatasets() {
  try {
    const resp = await fetch("/datasets", { cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const body = await resp.json();
    state.datasets = Array.isArray(body.datasets) ? body.datasets : [];
    state.maxUpload = Number.isFinite(body.max_upload_bytes) ? body.max_upload_bytes : null;
  } catch (err) {
    console.warn(`datasets: /datasets did not answer (${err.message}); the embedded sets only`);
  }
  state.datasetsLoaded = true;
  renderDatasets();
  $("data-file-hint").textContent = state.maxUpload
    ? `at most ${F.count(state.maxUpload / 1024)} KiB; the server turns it into the text task's data (as daisychain train --data FILE)`
    : "the server turns it into the text task's data (as daisychain train --data FILE)";
}

const UPLOAD_NAME = /^[A-Za-z0-9][A-Za-z0-9._ -]{0,79}$/;

async function uploadData(file) {
  setFieldError("data_file", "");
  const ext = (file.name.match(/\.[^.]+$/) || [""])[0].toLowerCase();
  if (![".txt", ".csv"].includes(ext)) return setFieldError("data_file", `${file.name} is not a .txt or .csv file`);
  if (!UPLOAD_NAME.test(file.name)) {
    return setFieldError("data_file", "rename the file: letters, digits, . _ - and spaces only (at most 80 characters)");
  }
  if (state.maxUpload && file.size > state.maxUpload) {
    return setFieldError("data_file", `${file.name} is ${F.count(file.size / 1024)} KiB, over the ${F.count(state.maxUpload / 1024)} KiB limit`);
  }
  if (!file.size) return setFieldError("data_file", `${file.name} is empty`);
  $("data-file-hint").textContent = `sending ${file.name} (${F.count(file.size)} bytes)…`;
  try {
    const resp = await fetch(`/datasets/upload?name=${encodeURIComponent(file.name)}`, {
      method: "POST", body: file, headers: { "Content-Type": "application/octet-stream" } });
    if (!resp.ok) {
      const why = (await resp.text()).trim() || `HTTP ${resp.status}`;
      throw new Error(why.replace(/^\d{3}: [A-Za-z ]+\s*/, ""));
    }
    const entry = await resp.json();
    state.upload = entry;
    state.datasets = [entry, ...state.datasets.filter((d) => d.fingerprint !== entry.fingerprint)];
    $("f-task").value = entry.task;
    renderDatasets(entry.fingerprint);
    $("data-file-hint").textContent = `${entry.name}: ${F.count(entry.train)} training and ${F.count(entry.test)} test samples, ` +
      `${entry.classes} classes, fingerprint ${entry.fingerprint.slice(0, 12)}…`;
    event(`${entry.name} is on the server: ${F.count(entry.train)} training samples (fingerprint ${entry.fingerprint.slice(0, 12)}…)`);
    validate();
  } catch (err) {
    $("data-file-hint").textContent = "";
    setFieldError("data_file", `${file.name} was not taken: ${err.message}`);
  }
}

function setFieldError(name, text) {
  if (text) state.fieldErrors[name] = text;
  else delete state.fieldErrors[name];
  const el = $(`err-${name}`);
  if (!el) return;
  el.textContent = text || "";
  el.closest(".field")?.classList.toggle("invalid", !!text);
  const input = $("settings").elements[name];
  if (input) input.setAttribute("aria-invalid", text ? "true" : "false");
}

/** The settings form -> {settings, errors: {field: message}}, with the rules of
 *  engine/settings.py and spec.py (Hyper.validate, parse_layers). */
function readSettings() {
  const f = $("settings").elements;
  const errors = {};
  const int = (name, label, lo, hi = Infinity) => {
    const raw = f[name].value.trim();
    const v = Number(raw);
    if (raw === "" || !Number.isInteger(v)) errors[name] = `${label} must be a whole number`;
    else if (v < lo || v > hi) errors[name] = hi === Infinity ? `${label} must be ${lo} or more` : `${label} must lie in [${lo}, ${hi}]`;
    return v;
  };
  const steps = int("steps", "steps", 0);
  const seed = int("seed", "the seed", 0, 0xFFFFFFFF);
  const batch = int("batch", "the batch", 1);
  const micro = int("micro_batch", "the micro-batch", 1, 4096);
  const hidden = int("hidden", "hidden", 1);
  const lr = Number(f.lr.value);
  if (f.lr.value.trim() === "" || !Number.isFinite(lr) || !(lr > 0)) errors.lr = "the learning rate must be a positive number";
  if (!errors.batch && !errors.micro_batch && batch % micro) {
    errors.batch = `the batch (${batch}) must be a multiple of the micro-batch (${micro})`;
  }
  if (!errors.batch && !errors.micro_batch && !errors.seed && !errors.lr) {
    try {
      makeHyper({ seed, batch, micro_batch: micro, lr });
    } catch (err) {
      errors.batch = err.message;
    }
  }
  let layers = null;
  const lt = f.layers.value.trim();
  if (lt) {
    try {
      layers = parseLayers(lt);
    } catch (err) {
      errors.layers = err.message.replace("--layers takes", "takes");
    }
  }
  const task = f.task.value;
  const ds = chosenDataset();
  if (state.datasets.length && !ds) errors.dataset = "choose the data to train on";
  else if (ds && ds.task !== task) errors.dataset = `${ds.name} is data of the ${ds.task} task, not ${task}`;
  if (state.fieldErrors.data_file) errors.data_file = state.fieldErrors.data_file;
  const settings = { task, steps, seed, batch, micro_batch: micro, lr, hidden, layers, dataset: ds };
  return { settings, errors };
}

function validate() {
  const { settings, errors } = readSettings();
  for (const name of FIELDS) if (name !== "data_file") setFieldError(name, errors[name] || "");
  return { settings, errors };
}

// -- the run -----------------------------------------------------------------------------------

let chart = null;

function newChart() {
  state.chart = { loss: [], accuracy: [] };
  if (chart && typeof chart.clear === "function") {
    chart.clear();
    return;
  }
  chart = new Chart($("loss-plot"), {
    series: [{ key: "loss", label: "loss", axis: "left" }, { key: "accuracy", label: "test accuracy", axis: "right" }],
    logY: $("log-scale").checked,
  });
}

function chartAdd(key, x, y) {
  if (!Number.isFinite(y)) return;
  state.chart[key].push([x, y]);
  chart.add(key, x, y);
}

function newRun() {
  state.times = [];
  state.lastRate = NaN;
  state.runStart = { t: now(), step: 0 };
  state.liveAccuracy = { next: 0, busy: false, step: null, n: 0 };
  state.run.accuracy = null;
  state.end = null;
  state.counters = null;
  state.counterSteps = [];
  state.preparing = null;
  $("end-card").hidden = true;
  newChart();
  renderCounters();
}

function rateAndEta() {
  const rp = state.roomPeers;
  let rate = rp?.stepRate;
  let eta = rp?.etaSeconds;
  if (!Number.isFinite(rate)) {
    const t = state.times.slice(-30);
    rate = t.length >= 2 && t.at(-1)[0] > t[0][0] ? (t.at(-1)[1] - t[0][1]) / (t.at(-1)[0] - t[0][0]) : NaN;
  }
  if (!Number.isFinite(eta) && Number.isFinite(rate) && rate > 0 && Number.isFinite(state.run.steps)) {
    eta = Math.max(0, state.run.steps - state.run.step) / rate;
  }
  return { rate, eta };
}

/** renderRun at the next frame, once however many events ask for it before then. */
function renderRunSoon() {
  if (renderRunSoon.queued) return;
  renderRunSoon.queued = true;
  const go = () => { renderRunSoon.queued = false; renderRun(); };
  if (document.hidden) setTimeout(go, 250); else requestAnimationFrame(go);
}

function renderRun() {
  const r = state.run;
  $("run-state").textContent = words(r.text || r.state);
  $("step").textContent = String(r.step);
  $("steps-total").textContent = r.steps ?? "—";
  $("loss").textContent = F.loss(r.loss);
  $("params-sha256").textContent = r.sha || "—";
  $("run-id").textContent = r.runId || "—";
  const la = state.liveAccuracy;
  $("accuracy").textContent = r.state === "done" && Number.isFinite(r.accuracy) ? `${F.percent(r.accuracy)} (the whole test set)`
    : la && Number.isFinite(la.value) ? `${F.percent(la.value)} at step ${la.step} (${F.count(la.n)} test samples)` : "—";
  const { rate, eta } = rateAndEta();
  const live = r.state === "running";
  if (live && Number.isFinite(rate)) state.lastRate = rate;
  $("step-rate").textContent = live || r.state === "done" ? F.stepRate(live ? rate : state.lastRate) : "—";
  $("eta").textContent = live ? F.duration(eta) : r.state === "done" ? "done" : "—";
  $("preparing").hidden = r.state !== "starting";
  renderRunbar(eta);
  renderPreparing();
  renderPeers();
  renderSettings();
  renderChecklist();
}

/** Test samples the live accuracy is measured on (the first ones of the test split). */
const LIVE_ACC_SAMPLES = 500;

/** Every this many steps the page measures the test accuracy (about 40 points a run). */
function accuracyEvery(steps) {
  return Math.max(5, Math.ceil((Number(steps) || 0) / 40));
}

/** Test accuracy of the replica now, on a fixed subset, in the compute worker; the
 *  parameters are only read (a copy goes to the worker), so the run's hash is unchanged. */
function liveAccuracy(step) {
  const la = state.liveAccuracy;
  const tr = mesh?.peer?.trainer;
  if (!la || la.busy || !tr || typeof tr.probs !== "function" || step < la.next) return;
  if (Number.isFinite(state.run.steps) && step >= state.run.steps) return; // the end measures the whole set
  la.busy = true;
  la.next = step + accuracyEvery(state.run.steps);
  const n = Math.min(LIVE_ACC_SAMPLES, tr.ds.y_test.data.length);
  tr.accuracy("test", n).then((acc) => {
    if (state.liveAccuracy !== la) return; // another run began meanwhile
    Object.assign(la, { value: acc, step, n });
    chartAdd("accuracy", step, acc);
    renderRun();
  }).catch((err) => console.warn(`live accuracy: ${err.message}`)).finally(() => { la.busy = false; });
}

const TITLE = document.title;

/** The bar pinned at the top during a run (step / total, time left, accuracy) and the tab's title. */
function renderRunbar(eta) {
  const r = state.run;
  const live = ["starting", "running"].includes(r.state);
  $("runbar").hidden = !live;
  if (!live) return;
  const total = Number.isFinite(r.steps) ? r.steps : null;
  $("rb-step").textContent = `${F.count(r.step)} / ${total === null ? "—" : F.count(total)}`;
  $("rb-progress").value = total ? Math.min(1, r.step / total) : 0;
  $("rb-eta").textContent = r.state === "starting" ? "preparing" : F.duration(eta);
  $("rb-acc").textContent = F.percent(state.liveAccuracy?.value);
  document.title = total ? `${Math.floor((100 * r.step) / Math.max(total, 1))}% · step ${r.step} of ${total} — DaisyChain` : TITLE;
}

/** The end of a run, said where the person is: the tab's title and (if allowed) a notification. */
function sayRunEnded(d) {
  const acc = Number.isFinite(d.accuracy) ? `, test accuracy ${F.percent(d.accuracy)}` : "";
  const stopped = Number.isFinite(state.run.steps) && d.step < state.run.steps;
  const text = `${stopped ? "Stopped" : "Done"} after ${F.count(d.step)} steps${acc}`;
  document.title = `${stopped ? "Stopped" : "Done"}${acc ? `: ${F.percent(d.accuracy)}` : ""} — DaisyChain`;
  state.ended = { text, title: document.title, notified: false };
  if (typeof Notification === "function" && Notification.permission === "granted" && document.hidden) {
    try {
      new Notification("DaisyChain: the run is done", { body: text, tag: "daisychain-run" });
      state.ended.notified = true;
    } catch { /* some browsers only notify from a service worker: the title says it */ }
  }
}

function renderPreparing() {
  const p = state.preparing;
  const bar = $("preparing-bar");
  if (p && Number.isFinite(p.total) && p.total > 0) {
    bar.max = p.total;
    bar.value = Math.min(p.done ?? 0, p.total);
    $("preparing-text").textContent = `Preparing the run: ${p.stage || "working"} (${p.done ?? 0} of ${p.total})`;
  } else {
    bar.removeAttribute("value");
    $("preparing-text").textContent = p?.stage ? `Preparing the run: ${p.stage}…` : "Preparing the run…";
  }
}

function renderCounters() {
  const c = state.counters;
  for (const k of ["multiply", "requantize", "relu", "micro"]) {
    const el = $(`count-${k}`);
    el.textContent = c && Number.isFinite(c[k]) ? F.count(c[k]) : "—";
    el.dataset.value = c && Number.isFinite(c[k]) ? String(c[k]) : "";
  }
}

function identityOfRun() {
  return mesh?.peer?.identity || mesh?.peer?.run?.identity || null;
}

function showEnd(d) {
  const r = state.run;
  const t = state.runStart ? now() - state.runStart.t : NaN;
  const stepsDone = d.step - (state.runStart?.step ?? 0);
  const identity = identityOfRun();
  const entry = identity ? state.datasets.find((x) => x.fingerprint === identity.dataset) : null;
  const command = identity ? F.trainCommand(identity, entry?.train_args, d.step) : null;
  if (identity && !entry) { // data another device sent after this page read the list: read it again
    loadDatasets().then(() => {
      const e = state.datasets.find((x) => x.fingerprint === identity.dataset);
      if (e && state.end?.sha === d.sha) {
        state.end.command = F.trainCommand(identity, e.train_args, d.step);
        $("end-command").textContent = state.end.command;
      }
    });
  }
  const done = { ...(r.done || {}), ...(mesh?.peer?.doneBy || {}) };
  const rows = Object.fromEntries((state.roomPeers?.rows || []).map((p) => [p.id, p]));
  const ids = [...new Set([...(state.room?.members || []).map((m) => m.id), ...Object.keys(done), ...Object.keys(rows)])];
  const micro = Object.fromEntries(ids.map((id) => [id, done[id] ?? rows[id]?.micro ?? 0]));
  const total = Object.values(micro).reduce((a, b) => a + b, 0);
  state.end = { accuracy: d.accuracy, loss: r.loss, seconds: t, stepsPerSecond: t > 0 ? stepsDone / t : null,
    step: d.step, steps: r.steps, sha: d.sha, command, who: ids.map((id) => ({ id, name: nameOf(id), micro: micro[id] })) };
  $("end-title").textContent = d.step < (r.steps ?? d.step) ? `The run stopped at step ${d.step}` : "The run is done";
  $("end-accuracy").textContent = F.percent(d.accuracy);
  $("end-loss").textContent = F.loss(r.loss);
  $("end-time").textContent = F.duration(t);
  $("end-rate").textContent = state.end.stepsPerSecond ? `${state.end.stepsPerSecond.toFixed(2)}` : "—";
  $("end-steps").textContent = `${d.step}${r.steps ? ` of ${r.steps}` : ""}`;
  $("end-who").replaceChildren(...state.end.who.sort((a, b) => b.micro - a.micro).map((w) => {
    const li = document.createElement("li");
    li.dataset.peer = w.id;
    const pct = total ? ` (${Math.round((100 * w.micro) / total)}%)` : "";
    li.textContent = `${w.name === "you" ? `${state.names[w.id] || "this device"} (you)` : w.name}: ${F.count(w.micro)} micro-batches${pct}`;
    return li;
  }));
  $("end-sha").textContent = d.sha || "—";
  $("end-command").textContent = command || "daisychain train (the settings of this run)";
  $("end-same").hidden = !command;
  $("copy-command").hidden = !command;
  $("back-to-settings").hidden = !state.room?.isHost;
  $("end-card").hidden = false;
  renderCheckpoint();
  $("end-card").scrollIntoView({ block: "start", behavior: "smooth" });
  $("end-card").focus({ preventScroll: true });
}

// -- try the model -----------------------------------------------------------------------------

let tryPanel = null;

/** The try panel on this tab's replica (unless a checkpoint was chosen for it). */
function offerTry() {
  if (!tryPanel || state.tryCheckpoint) return;
  const tr = mesh?.peer?.trainer;
  tryPanel.use(tr || null, tr ? `the run's model as it is now (run ${state.run.runId || "—"})` : "");
}

/** A downloaded .pt (checked by the server) as the model to try; the run is not touched. */
async function tryCheckpoint(file) {
  $("try-error").textContent = "";
  try {
    const st = await importCheckpoint(new Uint8Array(await file.arrayBuffer()));
    const id = st.identity;
    const ds = await mesh.loadData(id.task, id.dataset);
    const d = state.device;
    const tr = await createTrainer({ spec: ModelSpec.fromJson(id.model), hyper: makeHyper(id.hyper), dataset: ds,
      luts: d.luts, units: d.units, kind: d.kind });
    tr.theta.set(st.theta);
    state.tryCheckpoint = { name: file.name, step: st.step, sha: st.params_sha256 };
    tryPanel.use(tr, `${file.name} (step ${st.step})`);
    event(`trying ${file.name}: the model at step ${st.step}`);
  } catch (err) {
    $("try-error").textContent = `${file.name} cannot be tried: ${err.message}`;
  }
}

// -- checkpoints -------------------------------------------------------------------------------

function renderCheckpoint() {
  const c = state.checkpoint;
  const host = !!state.room?.isHost && !state.pending;
  const noDownload = c.busy || !mesh?.hasState() || state.run.state === "starting";
  $("download-checkpoint").disabled = noDownload;
  $("end-download").disabled = noDownload;
  $("upload-checkpoint").disabled = c.busy || !host || !state.ready || state.run.state === "starting";
  $("upload-label").title = host ? "" : "Only the host restores the room from a checkpoint.";
  if (c.info) $("checkpoint-info").textContent = words(c.info);
  showError("checkpoint-error", c.error);
}

function checkpointNote(text) {
  state.checkpoint.info = text;
  state.checkpoint.error = null;
  event(text);
  renderCheckpoint();
}

function checkpointError(text) {
  state.checkpoint.error = text;
  event(text, "error");
  renderCheckpoint();
}

/** Any device holding the run: the replica's state -> a .pt download. */
async function downloadCheckpoint() {
  state.checkpoint.busy = true;
  state.checkpoint.error = null;
  renderCheckpoint();
  try {
    const snap = await mesh.snapshot();
    const { bytes, filename, params_sha256: sha } = await exportCheckpoint(snap);
    const url = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
    const a = document.createElement("a");
    a.href = url;
    a.download = filename;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
    state.checkpoint.saved.push({ filename, step: snap.step, sha });
    checkpointNote(`Saved ${filename}: step ${snap.step}, params-sha256 ${sha}.`);
  } catch (err) {
    checkpointError(`The checkpoint could not be made: ${err.message}`);
  } finally {
    state.checkpoint.busy = false;
    renderCheckpoint();
  }
}

/** The host: a .pt -> checked by the server -> the room restored (or, before a run, the
 *  state the next Start begins from). A bad file changes nothing and says why. */
async function uploadCheckpoint(file) {
  state.checkpoint.busy = true;
  state.checkpoint.error = null;
  renderCheckpoint();
  try {
    const bytes = new Uint8Array(await file.arrayBuffer());
    const restoring = mesh.canRestore();
    const st = await importCheckpoint(bytes, restoring ? mesh.peer.identity : null);
    if (restoring) {
      const done = state.run.state === "done";
      const steps = done ? readSettings().settings.steps : null; // a finished run goes on to the steps set below
      await mesh.restore(st, steps);
      state.checkpoint.restores.push({ name: file.name, step: st.step, sha: st.params_sha256 });
      checkpointNote(`${file.name} restored the room: every device continues from step ${st.step} ` +
        `(params-sha256 ${st.params_sha256}).`);
    } else {
      state.checkpoint.loaded = { ...st, name: file.name };
      const s = settingsOf(st.identity);
      const f = $("settings").elements;
      if (s.task && f.task) f.task.value = s.task;
      for (const [k, v] of Object.entries(s)) {
        if (k === "layers" || k === "task") continue;
        if (v !== null && v !== undefined && f[k]) f[k].value = String(v);
      }
      f.layers.value = s.layers && s.layers.length > 1 ? s.layers.join(",") : "";
      const ds = state.datasets.find((d) => d.fingerprint === st.identity.dataset);
      renderDatasets(ds?.fingerprint ?? state.datasets.find((d) => d.origin === "embedded" && d.task === s.task)?.fingerprint);
      if (Number(f.steps.value) < st.step) f.steps.value = String(st.step);
      validate();
      checkpointNote(`${file.name} is checked and loaded (${st.identity.task}, step ${st.step}, params-sha256 ` +
        `${st.params_sha256}). Start trains from step ${st.step} to the steps set below.`);
    }
  } catch (err) {
    checkpointError(`${file.name} was not loaded: ${err.message}. Nothing was changed.`);
  } finally {
    state.checkpoint.busy = false;
    renderCheckpoint();
  }
}

// -- bus -> DOM --------------------------------------------------------------------------------

bus.on("net:status", ({ state: s, text }) => {
  if (s === "online" && state.run.state !== "idle") return;
  status(text, s === "refused" || s === "offline");
});
bus.on("net:welcome", ({ id, resumed }) => {
  state.id = id;
  state.online = true;
  const queued = state.queuedRoomAction;
  state.queuedRoomAction = null;
  if (queued) setTimeout(queued, 0);
  if (state.device) state.names[id] = state.device.name;
  event(resumed ? "reconnected to the server" : "connected to the server");
});
bus.on("net:room", (room) => {
  const was = state.room;
  const wasPending = !!state.pending;
  for (const m of room.members) state.names[m.id] = m.name;
  for (const p of room.pending || []) state.names[p.id] = p.name;
  state.room = room;
  state.pending = null;
  state.denied = null;
  showError("room-error", "");
  if (wasPending) event(`the host let you into room ${room.code}`);
  if (room.room === "private" && (!was || was.code !== room.code) && room.isHost) {
    event(`private room ${room.code} created: show its QR code or send the link so others can ask to join`);
  }
  if (was && was.code === room.code) {
    const ids = new Set(room.members.map((m) => m.id));
    for (const m of was.members) {
      if (!ids.has(m.id)) announce(`${m.name} left the room`, `left:${m.id}:${state.run.runId || ""}:${state.run.step}`);
    }
    if (was.host !== room.host && running() && state.run.runId) handover(room.host, state.run.step);
  }
  state.requests = room.pending || [];
  state.ready = !!state.device;
  renderRoom();
});
bus.on("net:pending", ({ code }) => {
  state.pending = { code };
  state.deniedCode = code;
  state.denied = null;
  showError("room-error", "");
  state.room = null;
  event(`asked to join room ${code}; waiting for the host`);
  renderRoom();
});
bus.on("net:join-request", ({ peer }) => {
  state.names[peer.id] = peer.name;
  event(`${peer.name} (${kindName(peer.kind)}) asks to join`);
});
bus.on("net:error", ({ code, message }) => {
  state.error = words(message);
  if (code === "denied") {
    const wait = /ask again in (\d+) s/.exec(message);
    state.denied = { message, code: state.pending?.code || state.deniedCode || null,
      until: wait ? now() + Number(wait[1]) : 0 };
    state.room = null;
    state.pending = null;
    showError("room-error", `Not let in: ${message}.`);
    status(`Not let in: ${message}.`, true);
    renderRoom();
  } else if (["no_such_room", "room_full", "too_many_rooms", "too_many_pending"].includes(code)) {
    state.pending = null;
    showError("room-error", message);
    status(message, true);
    renderRoom();
  }
  event(`server: ${message}`, "error");
});
bus.on("peer:open", ({ id }) => {
  state.links[id] = "open";
  event(`direct link to ${nameOf(id)} is open`);
  renderPeers();
  renderMatrix();
});
bus.on("peer:close", ({ id }) => { state.links[id] = "closed"; renderPeers(); renderMatrix(); });
bus.on("peer:state", ({ id, state: s }) => {
  if (state.links[id] !== "open" || s === "failed") state.links[id] = s;
  renderPeers();
  renderMatrix();
});

// the data s11d's mesh/network publish (each optional: the page works without it)
bus.on("links", ({ rows }) => {
  state.linkRows = Object.fromEntries((rows || []).map((r) => [r.id, r]));
  renderPeers();
  renderMatrix();
});
bus.on("room:links", (d) => { state.matrix = d; renderMatrix(); });
bus.on("room:peers", (d) => {
  state.roomPeers = d;
  for (const r of d.rows || []) learnName(r.id, r.name);
  renderRunSoon();
});
bus.on("counters", (c) => {
  state.counters = c;
  state.counterSteps.push(c.micro);
  if (state.counterSteps.length > 1000) state.counterSteps.splice(0, 500);
  renderCounters();
});
bus.on("run:preparing", (p) => {
  state.preparing = p;
  if (state.run.state !== "starting") state.run.state = "starting";
  renderRun();
});
bus.on("run:handover", ({ step, host, hostName }) => {
  if (hostName && host) learnName(host, hostName);
  handover(host, step);
});
bus.on("run:stopped", ({ by, byName, step }) => {
  if (byName && by) learnName(by, byName);
  const who = by === state.id ? "you" : byName || nameOf(by);
  announce(`${who} stopped the run at step ${step}`, `stopped:${state.run.runId}`);
});
bus.on("room:left", ({ id, name }) => {
  if (name) learnName(id, name);
  announce(`${name || nameOf(id)} left the room`, `left:${id}:${state.run.runId || ""}:${state.run.step}`);
});

function handover(host, step) {
  const key = `host:${host}:${state.run.runId}`;
  if (host === state.id) announce(`you are now the host: the run goes on from step ${step}`, key);
  else announce(`${nameOf(host)} is now the host: the run goes on from step ${step}`, key);
}

bus.on("run:state", (s) => {
  const fresh = s.state === "starting" || (s.state === "running" && s.runId && s.runId !== state.run.runId && !state.runStart);
  if (s.state === "starting" && state.run.state !== "starting") newRun();
  else if (fresh && !state.runStart) newRun();
  Object.assign(state.run, s);
  if (s.state === "running" && !state.runStart) state.runStart = { t: now(), step: s.step || 0 };
  // a run that starts from a checkpoint counts its steps from there
  else if (s.state === "running" && state.runStart && !state.times.length && Number.isFinite(s.step)) state.runStart.step = s.step;
  if (s.text) event(s.text, s.state === "refused" || s.state === "failed" ? "error" : "");
  if (["running", "starting"].includes(s.state)) status(s.text || "training");
  if (s.state === "running") offerTry();
  renderRun();
});
bus.on("run:step", (s) => {
  if (!state.runStart) newRun();
  Object.assign(state.run, s);
  state.times.push([now(), s.step]);
  if (state.times.length > 200) state.times.splice(0, 100);
  chartAdd("loss", s.step, s.loss);
  if (Number.isFinite(s.accuracy)) chartAdd("accuracy", s.step, s.accuracy);
  liveAccuracy(s.step);
  renderRunSoon();
});
bus.on("run:done", (s) => {
  Object.assign(state.run, s);
  if (s.counters) { state.counters = s.counters; renderCounters(); }
  if (Number.isFinite(s.accuracy)) chartAdd("accuracy", s.step, s.accuracy);
  status(s.agreed === false ? s.text : `The run is done after ${s.step} steps: params-sha256 ${String(s.sha).slice(0, 16)}…`);
  event(s.text || "the run is done");
  renderRun();
  showEnd(s);
  sayRunEnded(s);
  offerTry();
  // a run that ends before its steps was stopped: said once, by run:stopped when it comes
  const runId = state.run.runId;
  if (Number.isFinite(state.run.steps) && s.step < state.run.steps) {
    setTimeout(() => announce(`the run was stopped at step ${s.step} of ${state.run.steps}`, `stopped:${runId}`), 400);
  }
  state.runStart = null;
});
bus.on("run:refused", ({ peer, name, message }) => {
  learnName(peer, name);
  const text = peer === state.id ? message : words(message);
  state.refusals.push({ peer, message: text });
  const li = document.createElement("li");
  li.textContent = text;
  $("refusals").appendChild(li);
  $("refusals").hidden = false;
  if (peer === state.id) showError("run-error", text);
  announce(peer === state.id ? text : `${name || nameOf(peer)} refused the run: ${text.replace(/^.*? refused the run: /, "")}`,
    `refused:${peer}:${state.run.runId}:${text}`);
});
bus.on("run:log", ({ text, peer, name }) => {
  learnName(peer, name);
  event(text);
});
bus.on("run:restored", (r) => {
  Object.assign(state.run, { step: r.step, sha: r.sha, steps: r.steps, loss: null });
  if (r.by !== state.id) state.checkpoint.restores.push({ by: r.by, step: r.step, sha: r.sha });
  newRun();
  renderRun();
});
bus.on("run:error", ({ message, peer, name }) => {
  learnName(peer, name);
  state.error = words(message);
  showError("run-error", message);
  status(message, true);
  event(message, "error");
});

// -- DOM -> actions ----------------------------------------------------------------------------

let net = null;
let mesh = null;
newChart();

/** Do a room action now, or (while a rename reconnects to the server) once it is back. */
function roomAction(fn, what) {
  if (state.online !== false) return fn();
  state.queuedRoomAction = fn;
  status(`reconnecting after the rename: ${what} as soon as the server answers`);
}

function joinFromBox() {
  let code;
  try {
    code = normalizeRoom($("join-code").value);
  } catch (err) {
    showError("room-error", err.message);
    $("join-code").focus();
    return;
  }
  showError("room-error", "");
  roomAction(() => {
    net.join(code);
    history.replaceState(null, "", `?room=${code}`);
  }, `asking to join ${code}`);
}

async function copyText(text, feedback) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch {
    ok = false;
  }
  $(feedback).textContent = ok ? "Copied" : "Select the text and copy it (this browser did not let the page copy)";
  $(feedback).className = ok ? "ok" : "error";
  clearTimeout(copyText.timers?.[feedback]);
  copyText.timers = { ...(copyText.timers || {}), [feedback]: setTimeout(() => { $(feedback).textContent = ""; }, 4000) };
  return ok;
}

function wire() {
  $("create-room").onclick = () => {
    showError("room-error", "");
    roomAction(() => {
      net.createRoom();
      history.replaceState(null, "", location.pathname);
    }, "creating the private room");
  };
  $("ask-again").onclick = () => {
    const code = state.denied?.code;
    if (!code) return;
    showError("room-error", "");
    roomAction(() => net.join(code), `asking to join ${code} again`);
  };
  $("join-room").onclick = joinFromBox;
  $("join-code").addEventListener("keydown", (e) => {
    if (e.key === "Enter") {
      e.preventDefault();
      joinFromBox();
    }
  });
  $("network-room").onclick = () => {
    showError("room-error", "");
    roomAction(() => {
      net.join("network");
      history.replaceState(null, "", location.pathname);
    }, "joining the network room");
  };
  $("copy-link").onclick = async () => {
    if (await copyText($("room-link").href, "copy-feedback")) {
      state.share.copied = true;
      renderChecklist();
    }
  };
  $("share-link").onclick = () => {
    navigator.share?.({ title: "Train with me on DaisyChain", text: `Room ${state.room?.code}`, url: $("room-link").href })
      .then(() => { state.share.copied = true; renderChecklist(); })
      .catch(() => {});
  };
  $("share-choice").onchange = (e) => {
    state.share.chosen = Number(e.target.value) || 0;
    renderShare();
  };
  $("device-name").onchange = () => {
    const name = $("device-name").value.trim();
    if (!name) return;
    localStorage.setItem("daisychain.name", name);
    state.device.name = name;
    if (state.id) state.names[state.id] = name;
    state.online = false; // the rename reconnects: room clicks wait for the server (roomAction)
    net.update({ name });
    event(`renamed to ${name}`);
  };
  $("f-task").addEventListener("change", () => {
    const ds = chosenDataset();
    const task = $("f-task").value;
    if (ds && ds.task !== task) {
      renderDatasets(state.datasets.find((d) => d.origin === "embedded" && d.task === task)?.fingerprint ?? null);
    }
    validate();
  });
  $("f-dataset").addEventListener("change", () => {
    renderDatasetInfo();
    const ds = chosenDataset();
    if (ds) $("f-task").value = ds.task;
    validate();
  });
  $("data-file").addEventListener("change", (e) => {
    const file = e.target.files?.[0];
    if (file) uploadData(file);
  });
  $("settings").addEventListener("input", (e) => { if (e.target.name !== "data_file") validate(); });
  $("settings").addEventListener("submit", (e) => { e.preventDefault(); $("start").click(); });
  $("start").onclick = () => {
    const { settings, errors } = validate();
    const bad = Object.keys(errors);
    if (bad.length) {
      showError("run-error", "Some settings need a fix: see the messages by the fields.");
      $("settings").elements[bad[0]]?.focus();
      return;
    }
    showError("run-error", "");
    if (typeof Notification === "function" && Notification.permission === "default") {
      Notification.requestPermission().catch(() => {});
    }
    const resume = state.checkpoint.loaded;
    state.settingsUsed = settings;
    mesh.start(settings, resume).then(() => {
      if (resume) {
        state.checkpoint.loaded = null;
        checkpointNote(`The run goes on from ${resume.name} (step ${resume.step}).`);
      }
    }).catch((err) => bus.emit("run:error", { message: err.message }));
  };
  $("download-checkpoint").onclick = () => downloadCheckpoint();
  $("try-it").onclick = () => {
    $("try-panel").scrollIntoView({ block: "start" });
    $("try-title").focus?.();
  };
  $("try-checkpoint").onchange = (e) => {
    const file = e.target.files?.[0];
    e.target.value = "";
    if (file) tryCheckpoint(file);
  };
  $("end-download").onclick = () => downloadCheckpoint();
  $("copy-command").onclick = () => copyText($("end-command").textContent, "command-feedback");
  $("back-to-settings").onclick = () => {
    $("end-card").hidden = true;
    $("settings-panel").scrollIntoView({ block: "start" });
    const first = $("settings").querySelector("select:not([disabled]), input:not([disabled])");
    (first || $("settings-title")).focus();
  };
  $("upload-checkpoint").onchange = (e) => {
    const file = e.target.files?.[0];
    e.target.value = ""; // choosing the same file again is a new upload
    if (file) uploadCheckpoint(file);
  };
  $("stop").onclick = () => mesh.stop("the host stopped the run");
  $("log-scale").onchange = (e) => chart.setLog(e.target.checked);
  // numbers that change with time (step rate, time left) without a new event
  setInterval(() => { if (state.run.state === "running") renderRun(); }, 1000);
}

async function main() {
  const params = new URLSearchParams(location.search);
  const name = (params.get("name") || defaultName()).slice(0, 64);
  $("device-name").value = name;
  let room;
  try {
    room = params.get("create") ? "new" : roomFromLocation(location.search);
  } catch (err) {
    showError("room-error", `${err.message} — joining your network room instead`);
    room = "network";
  }
  if (room && room !== "new" && room !== "network") $("join-code").value = room;
  status("Testing this device (golden vectors through every compute path)…");
  const datasets = loadDatasets();
  const device = await selfTestDevice({ want: params.get("path") });
  state.device = { ...device, name };
  renderDevice();
  event(`self-test: ${deviceReason(device)}`);
  net = new Network(bus, { name, kind: device.kind, capacity: device.capacity, room });
  mesh = new Mesh(bus, net, device);
  window.__daisy.mesh = mesh; // its state, for reading
  tryPanel = new TryPanel($("try-panel"));
  window.__tryPanel = tryPanel; // for tests (not in window.__daisy: it holds a model)
  offerTry();
  wire();
  datasets.then(() => validate());
  await net.start();
  state.ready = !!state.room;
  renderSettings();
  renderChecklist();
}

// Closing the only replica of a running run loses it: ask first (the others keep it alive).
window.addEventListener("beforeunload", (e) => {
  const busy = running() && mesh?.hasState();
  const others = Object.values(state.links).some((s) => s === "open");
  if (busy && !others) {
    e.preventDefault();
    e.returnValue = "This device holds the only copy of the run. Download a checkpoint first?";
  }
});

main().catch((err) => {
  console.error(err);
  state.error = `${err.name}: ${err.message}`;
  status(`This page could not start: ${err.message}`, true);
});

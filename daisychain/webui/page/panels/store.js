// The page's one store (window.__daisy) and its reducer: the state changes only here, by
// actions. The shells' bus events are actions (the store subscribes to them before any panel
// does, so a panel that draws on an event reads the state after it); a panel's own changes are
// actions it dispatches (`dispatch(type, detail)`). The panels read `state`, never write it
// (tests/page/test_panels.py holds them to it). Also here: the shared handles (ctx: the
// network, the mesh, the chart, the try panel, for reading) and the words every panel uses.

import * as F from "../ui_format.js";
import { bus } from "../../shell/bus.js";

export const $ = (id) => document.getElementById(id);

export const state = {
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

/** Handles the page reads (the shells, the try panel, the chart): set once at start (app.js; the chart panel its chart). */
export const ctx = { net: null, mesh: null, chart: null, tryPanel: null };

export const now = () => performance.now() / 1000;

/** Learn a device's name (this device's own is its device name, never "you"). */
function learnName(s, id, name) {
  if (!id || !name || (id === s.id && name === "you")) return;
  s.names[id] = name;
}

/** A new run here: its numbers start again (the chart's and the end card's too). */
function newRun(s) {
  Object.assign(s, { times: [], lastRate: NaN, runStart: { t: now(), step: 0 },
    liveAccuracy: { next: 0, busy: false, step: null, n: 0 }, end: null, counters: null, counterSteps: [],
    preparing: null, editing: false, chart: { loss: [], accuracy: [] } });
  s.run.accuracy = null;
}

const ROOM_CLOSED = ["no_such_room", "room_full", "too_many_rooms", "too_many_pending"];

/** type -> (state, detail) => the page events that follow it (or nothing). The bus events of
 *  the shells (bus.js) first, then the panels' own actions. */
export const ACTIONS = {
  "net:welcome": (s, { id }) => {
    s.id = id;
    s.online = true;
    if (s.device) s.names[id] = s.device.name;
  },
  "net:room": (s, room) => {
    const was = s.room;
    const change = { wasPending: !!s.pending, created: false, left: [], hostChanged: false };
    for (const m of room.members) s.names[m.id] = m.name;
    for (const p of room.pending || []) s.names[p.id] = p.name;
    change.created = room.room === "private" && (!was || was.code !== room.code) && room.isHost;
    if (was && was.code === room.code) {
      const ids = new Set(room.members.map((m) => m.id));
      change.left = was.members.filter((m) => !ids.has(m.id));
      change.hostChanged = was.host !== room.host;
    }
    Object.assign(s, { room, pending: null, denied: null, requests: room.pending || [], ready: !!s.device,
      roomChange: change });
  },
  "net:pending": (s, { code }) => { Object.assign(s, { pending: { code }, deniedCode: code, denied: null, room: null }); },
  "net:join-request": (s, { peer }) => { s.names[peer.id] = peer.name; },
  "net:error": (s, { code, message }) => {
    s.error = words(message);
    if (code === "denied") {
      const wait = /ask again in (\d+) s/.exec(message);
      s.denied = { message, code: s.pending?.code || s.deniedCode || null, until: wait ? now() + Number(wait[1]) : 0 };
      s.room = null;
      s.pending = null;
    } else if (ROOM_CLOSED.includes(code)) s.pending = null;
  },
  "peer:open": (s, { id }) => { s.links[id] = "open"; },
  "peer:close": (s, { id }) => { s.links[id] = "closed"; },
  "peer:state": (s, { id, state: st }) => { if (s.links[id] !== "open" || st === "failed") s.links[id] = st; },
  "links": (s, { rows }) => { s.linkRows = Object.fromEntries((rows || []).map((r) => [r.id, r])); },
  "room:links": (s, d) => { s.matrix = d; },
  "room:peers": (s, d) => {
    s.roomPeers = d;
    for (const r of d.rows || []) learnName(s, r.id, r.name);
  },
  "counters": (s, c) => {
    s.counters = c;
    s.counterSteps.push(c.micro);
    if (s.counterSteps.length > 1000) s.counterSteps.splice(0, 500);
  },
  "run:preparing": (s, p) => {
    s.preparing = p;
    if (s.run.state !== "starting") s.run.state = "starting";
  },
  "run:handover": (s, { host, hostName }) => { if (hostName && host) learnName(s, host, hostName); },
  "run:stopped": (s, { by, byName }) => { if (byName && by) learnName(s, by, byName); },
  "room:left": (s, { id, name }) => { if (name) learnName(s, id, name); },
  "run:state": (s, d) => {
    const fresh = d.state === "starting" || (d.state === "running" && d.runId && d.runId !== s.run.runId && !s.runStart);
    let out;
    if ((d.state === "starting" && s.run.state !== "starting") || (fresh && !s.runStart)) {
      newRun(s);
      out = [["page:new-run", { gallery: true }]];
    }
    Object.assign(s.run, d);
    if (d.state === "running" && !s.runStart) s.runStart = { t: now(), step: d.step || 0 };
    // a run that starts from a checkpoint counts its steps from there
    else if (d.state === "running" && s.runStart && !s.times.length && Number.isFinite(d.step)) s.runStart.step = d.step;
    return out;
  },
  "run:step": (s, d) => {
    let out;
    if (!s.runStart) {
      newRun(s);
      out = [["page:new-run", { gallery: false }]];
    }
    Object.assign(s.run, d);
    s.times.push([now(), d.step]);
    if (s.times.length > 200) s.times.splice(0, 100);
    return out;
  },
  "run:done": (s, d) => {
    Object.assign(s.run, d);
    if (d.counters) s.counters = d.counters;
    // the end card's time counts from the run's start here (runEnded: the start it had)
    s.runEnded = s.runStart;
    s.runStart = null;
  },
  "run:refused": (s, { peer, name, message }) => {
    learnName(s, peer, name);
    s.refusals.push({ peer, message: peer === s.id ? message : words(message) });
  },
  "run:log": (s, { peer, name }) => { learnName(s, peer, name); },
  "run:error": (s, { peer, name }) => { learnName(s, peer, name); },
  "run:restored": (s, r) => {
    Object.assign(s.run, { step: r.step, sha: r.sha, steps: r.steps, loss: null });
    if (r.by !== s.id) s.checkpoint.restores.push({ by: r.by, step: r.step, sha: r.sha });
    newRun(s);
    return [["page:new-run", { gallery: false }]];
  },

  // -- the panels' own -------------------------------------------------------------------------
  "device": (s, { device }) => { s.device = device; },
  "device:run-capacity": (s, { capacity, micro }) => {
    Object.assign(s.device, { runCapacity: capacity, runMicro: micro });
    s.runMicro = micro;
  },
  "renamed": (s, { name }) => {
    s.device.name = name;
    if (s.id) s.names[s.id] = name;
    s.online = false; // the rename reconnects: room clicks wait for the server
  },
  "mesh": (s, { mesh }) => { s.mesh = mesh; },
  "ready": (s, { ready }) => { s.ready = ready; },
  "error": (s, { message }) => { s.error = message; },
  "event": (s, { text }) => { s.events.push(text); },
  "announced": (s, { key, text }) => { s.announcements.push({ key, text }); },
  "no-share": (s, { who, why }) => { (s.noShare ||= {})[who] = why; },
  "share": (s, share) => { s.share = share; },
  "share:links": (s, { links, note }) => {
    if (Array.isArray(links) && links.length) s.share.links = links;
    s.share.note = note || "";
  },
  "share:copied": (s) => { s.share.copied = true; },
  "share:chosen": (s, { chosen }) => { s.share.chosen = chosen; },
  "task": (s, { task }) => { s.task = task; },
  "datasets": (s, { datasets, maxUpload }) => { Object.assign(s, { datasets, maxUpload }); },
  "datasets:loaded": (s) => { s.datasetsLoaded = true; },
  "datasets:uploaded": (s, { entry }) => {
    s.upload = entry;
    s.datasets = [entry, ...s.datasets.filter((d) => d.fingerprint !== entry.fingerprint)];
  },
  "field-error": (s, { name, text }) => {
    if (text) s.fieldErrors[name] = text;
    else delete s.fieldErrors[name];
  },
  "run-settings": (s, { runId }) => { s.runSettings = { runId }; },
  "settings-used": (s, { settings }) => { s.settingsUsed = settings; },
  "starting": (s, { attempt }) => { s.starting = attempt; },
  "start-cancelled": (s) => { if (s.starting) s.starting.cancelled = true; },
  "editing": (s, { editing }) => { s.editing = editing; },
  "not-started": (s, { message }) => { // back to the settings: the run did not start
    if (s.run.state === "starting") s.run.state = "idle";
    s.run.text = message;
    s.preparing = null;
    s.starting = null;
  },
  "checkpoint": (s, c) => { Object.assign(s.checkpoint, c); },
  "checkpoint:saved": (s, saved) => { s.checkpoint.saved.push(saved); },
  "checkpoint:restored": (s, restore) => { s.checkpoint.restores.push(restore); },
  "try-checkpoint": (s, t) => { s.tryCheckpoint = t; },
  "end": (s, { end }) => { s.end = end; },
  "end:command": (s, { command }) => { s.end.command = command; },
  "ended": (s, ended) => { s.ended = ended; },
  "ended:notified": (s) => { s.ended.notified = true; },
  "last-rate": (s, { rate }) => { s.lastRate = rate; },
  "chart:point": (s, { key, x, y }) => { s.chart[key].push([x, y]); },
  "live-accuracy": (s, { la, ...d }) => { if (s.liveAccuracy === la) Object.assign(la, d); },
  "gallery:shown": (s, { step }) => { (s.galleryShown ??= []).push(step); },
  "gallery:reset": (s) => { s.galleryShown = []; },
};

/** Change the state by the action `type` (ACTIONS); the page events it implies follow. */
export function dispatch(type, detail = {}) {
  const reduce = ACTIONS[type];
  if (!reduce) throw new Error(`store: no action ${type}`);
  for (const [t, d] of reduce(state, detail) || []) bus.emit(t, d);
}

// the shells' events reach the store first (this module subscribes before any panel exists)
for (const type of Object.keys(ACTIONS)) {
  if (/^(net|peer|run|room):|^(links|counters)$/.test(type)) bus.on(type, (d) => dispatch(type, d));
}

export function nameOf(id) {
  if (!id) return "someone";
  if (id === state.id) return "you";
  return state.room?.members.find((m) => m.id === id)?.name || state.names[id] || "a device that left";
}

/** Text from the mesh with device ids put in words. */
export function words(text) {
  return F.namesForIds(text, state.names);
}

export function defaultName() {
  const saved = localStorage.getItem("daisychain.name");
  if (saved) return saved;
  const ua = navigator.userAgent;
  const os = /Android/.test(ua) ? "Android" : /iPhone|iPad/.test(ua) ? "iOS" : /Mac/.test(ua) ? "Mac"
    : /Windows/.test(ua) ? "Windows" : /Linux/.test(ua) ? "Linux" : "Device";
  return `${os} ${Math.floor(Math.random() * 900 + 100)}`;
}

export function kindName(kind) {
  return { webgpu: "WebGPU tab", cpu: "CPU tab", python: "daisy-peer (Python)" }[kind] || kind || "—";
}

export const running = () => ["starting", "running"].includes(state.run.state);

/** The data set the settings' list has chosen (null: none, or the list is not read yet). */
export function chosenDataset() {
  return state.datasets.find((d) => d.fingerprint === $("f-dataset").value) || null;
}

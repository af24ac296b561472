// The page's one store (window.__daisy), the shared handles (ctx: the network, the mesh, the
// chart, the try panel) and the words every panel uses for devices.
// A panel of the page (app.js wires the bus to them): it owns its part of the DOM and reads
// the one store (store.js state).

import * as F from "../ui_format.js";

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

/** Handles the panels share: set once by app.js main(). */
export const ctx = { net: null, mesh: null, chart: null, tryPanel: null };

export const now = () => performance.now() / 1000;

/** Learn a device's name (this device's own is its device name, never "you"). */
export function learnName(id, name) {
  if (!id || !name || (id === state.id && name === "you")) return;
  state.names[id] = name;
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

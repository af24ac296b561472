// The page (index.html): DOM only. It shows what network.js and mesh.js report on the bus
// and turns the user's clicks into calls on them; it never touches RTCPeerConnection.
//
// window.__daisy exposes the page's state for tests and curious users (read-only use).

import { bus } from "./bus.js";
import { exportCheckpoint, importCheckpoint, settingsOf } from "./checkpoint.js";
import { Mesh, selfTestDevice } from "./mesh.js";
import { Network } from "./network.js";
import { LossPlot } from "./plot.js";
import { normalizeRoom, roomFromLocation } from "./protocol.js";

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
  run: { state: "idle", step: 0, steps: null, loss: null, sha: null, runId: null, shares: {}, done: {}, accuracy: null },
  refusals: [],        // {peer, message}: devices that declined the run, and why
  checkpoint: { busy: false, loaded: null, saved: [], restores: [], error: null, info: null },
  events: [],
};
window.__daisy = state;

function event(text, cls = "") {
  state.events.push(text);
  console.log(`[daisy] ${text}`);
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()} — ${text}`;
  if (cls) li.className = cls;
  const ol = $("events");
  ol.appendChild(li);
  while (ol.children.length > 200) ol.firstChild.remove();
  ol.scrollTop = ol.scrollHeight;
}

function status(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

function showError(id, text) {
  const el = $(id);
  el.textContent = text || "";
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

// -- rendering ---------------------------------------------------------------------------------

function renderDevice() {
  const d = state.device;
  if (!d) return;
  $("device-kind").textContent = d.kind === "webgpu" ? "WebGPU (the WGSL unit kernels)" : "CPU (the JS units)";
  $("device-reason").textContent = d.reason;
  $("device-capacity").textContent = `${d.capacity.toFixed(1)} micro-batches/s`;
}

function roomLink(code) {
  const url = new URL(location.href);
  url.search = `?room=${code}`;
  url.hash = "";
  return url.toString();
}

function renderRoom() {
  const r = state.room;
  const waiting = !!state.pending;
  $("waiting").hidden = !waiting;
  if (waiting) {
    $("waiting-text").textContent = `You asked to join room ${state.pending.code}. ` +
      "The host sees your device and decides; this page continues by itself once you are let in.";
    $("room-code").textContent = state.pending.code;
    $("room-info").textContent = "Waiting for approval.";
  } else if (r) {
    $("room-info").textContent = r.room === "private"
      ? `Private room — ${r.members.length} device${r.members.length === 1 ? "" : "s"}${r.isHost ? ", you are the host" : ""}.`
      : `Network room: the devices on your network — ${r.members.length} here${r.isHost ? ", you are the host" : ""}.`;
    $("room-code").textContent = r.code || "network room (no code)";
  }
  const code = !waiting && r?.room === "private" ? r.code : null;
  $("room-link-row").hidden = !code;
  if (code) {
    $("room-link").textContent = roomLink(code);
    $("room-link").href = roomLink(code);
  }
  const host = !!r?.isHost;
  $("approvals-panel").hidden = !(host && r.room === "private");
  renderApprovals();
  renderPeers();
  renderSettings();
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
    const li = document.createElement("li");
    li.dataset.peer = dev.id;
    const label = document.createElement("span");
    label.textContent = `${dev.name} — ${kindName(dev.kind)}, ${dev.capacity.toFixed(1)} micro-batches/s`;
    const yes = document.createElement("button");
    yes.className = "approve";
    yes.textContent = "Approve";
    yes.onclick = () => { net.approve(dev.id); event(`you let ${dev.name} in`); };
    const no = document.createElement("button");
    no.className = "deny";
    no.textContent = "Deny";
    no.onclick = () => { net.deny(dev.id); event(`you declined ${dev.name}`); };
    li.append(label, yes, no);
    ul.appendChild(li);
  }
}

function kindName(kind) {
  return { webgpu: "WebGPU tab", cpu: "CPU tab", python: "daisy-peer (Python)" }[kind] || kind;
}

function renderPeers() {
  const tb = $("peers");
  tb.replaceChildren();
  const r = state.room;
  if (!r) return;
  const shares = state.run.shares || {};
  const totalShare = Object.values(shares).reduce((a, b) => a + b, 0);
  for (const m of r.members) {
    const tr = document.createElement("tr");
    tr.dataset.peer = m.id;
    if (m.id === r.you) tr.classList.add("me");
    if (m.host) tr.classList.add("host");
    const link = m.id === r.you ? "—" : (state.links[m.id] || "connecting");
    const share = shares[m.id] !== undefined && totalShare
      ? `${shares[m.id]} of ${totalShare} (${Math.round((100 * shares[m.id]) / totalShare)}%)` : "—";
    const cells = [m.name, kindName(m.kind), `${m.capacity.toFixed(1)} mb/s`, link, share,
      String(state.run.done?.[m.id] ?? 0)];
    for (const text of cells) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.appendChild(td);
    }
    tb.appendChild(tr);
  }
}

function renderSettings() {
  const host = !!state.room?.isHost && !state.pending;
  const running = ["starting", "running"].includes(state.run.state);
  $("start").disabled = !host || running || !state.ready;
  $("stop").disabled = !host || !running;
  for (const el of $("settings").elements) el.disabled = !host || running;
  renderCheckpoint();
  $("settings-hint").textContent = host
    ? "You are the host: choose the settings and start; every device trains the same model."
    : "The host chooses these settings and starts the run.";
}

function renderRun() {
  const r = state.run;
  $("run-state").textContent = r.text || r.state;
  $("step").textContent = String(r.step);
  $("steps-total").textContent = r.steps ?? "—";
  $("loss").textContent = Number.isFinite(r.loss) ? r.loss.toFixed(4) : "—";
  $("params-sha256").textContent = r.sha || "—";
  $("run-id").textContent = r.runId || "—";
  $("accuracy").textContent = Number.isFinite(r.accuracy) ? `${(r.accuracy * 100).toFixed(2)}%` : "—";
  renderPeers();
  renderSettings();
}

function renderCheckpoint() {
  const c = state.checkpoint;
  const host = !!state.room?.isHost && !state.pending;
  $("download-checkpoint").disabled = c.busy || !mesh?.hasState() || state.run.state === "starting";
  $("upload-checkpoint").disabled = c.busy || !host || !state.ready || state.run.state === "starting";
  $("upload-label").title = host ? "" : "Only the host restores the room from a checkpoint.";
  if (c.info) $("checkpoint-info").textContent = c.info;
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
      const steps = done ? readSettings().steps : null; // a finished run goes on to the steps set below
      await mesh.restore(st, steps);
      state.checkpoint.restores.push({ name: file.name, step: st.step, sha: st.params_sha256 });
      checkpointNote(`${file.name} restored the room: every device continues from step ${st.step} ` +
        `(params-sha256 ${st.params_sha256}).`);
    } else {
      state.checkpoint.loaded = { ...st, name: file.name };
      const s = settingsOf(st.identity);
      const f = $("settings").elements;
      for (const [k, v] of Object.entries(s)) if (v !== null && v !== undefined && f[k]) f[k].value = String(v);
      if (Number(f.steps.value) < st.step) f.steps.value = String(st.step);
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

function readSettings() {
  const f = $("settings").elements;
  const int = (name) => {
    const v = Number(f[name].value);
    if (!Number.isInteger(v)) throw new Error(`${name.replace("_", "-")} must be a whole number`);
    return v;
  };
  const lr = Number(f.lr.value);
  if (!(lr > 0)) throw new Error("the learning rate must be a positive number");
  return { task: f.task.value, steps: int("steps"), seed: int("seed"), batch: int("batch"),
    micro_batch: int("micro_batch"), lr, hidden: int("hidden") };
}

// -- bus -> DOM --------------------------------------------------------------------------------

bus.on("net:status", ({ state: s, text }) => {
  if (s === "online" && state.run.state !== "idle") return;
  status(text, s === "refused" || s === "offline");
});
bus.on("net:welcome", ({ id, resumed }) => {
  state.id = id;
  event(resumed ? `reconnected as ${id}` : `connected to the server as ${id}`);
});
bus.on("net:room", (room) => {
  const was = state.room;
  const wasPending = !!state.pending;
  state.room = room;
  state.pending = null;
  state.denied = null;
  showError("room-error", "");
  if (wasPending) event(`the host let you into room ${room.code}`);
  if (room.room === "private" && (!was || was.code !== room.code) && room.isHost) {
    event(`private room ${room.code} created: share the link so others can ask to join`);
  }
  state.requests = room.pending || [];
  state.ready = !!state.device;
  renderRoom();
});
bus.on("net:pending", ({ code }) => {
  state.pending = { code };
  state.room = null;
  event(`asked to join room ${code}; waiting for the host`);
  renderRoom();
});
bus.on("net:join-request", ({ peer }) => event(`${peer.name} (${kindName(peer.kind)}) asks to join`));
bus.on("net:error", ({ code, message }) => {
  state.error = message;
  if (code === "denied") {
    state.denied = message;
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
bus.on("peer:open", ({ id }) => { state.links[id] = "open"; event(`direct link to ${nameOf(id)} is open`); renderPeers(); });
bus.on("peer:close", ({ id }) => { state.links[id] = "closed"; renderPeers(); });
bus.on("peer:state", ({ id, state: s }) => { if (state.links[id] !== "open" || s === "failed") state.links[id] = s; renderPeers(); });

bus.on("run:state", (s) => {
  Object.assign(state.run, s);
  if (s.state === "starting") plot.clear();
  if (s.text) event(s.text, s.state === "refused" || s.state === "failed" ? "error" : "");
  if (["running", "starting"].includes(s.state)) status(s.text || "training");
  renderRun();
});
bus.on("run:step", (s) => {
  Object.assign(state.run, s);
  plot.push(s.step, s.loss);
  renderRun();
});
bus.on("run:done", (s) => {
  Object.assign(state.run, s);
  status(s.text || `done: params-sha256 ${s.sha}`);
  event(s.text || "the run is done");
  renderRun();
});
bus.on("run:refused", ({ peer, message }) => {
  const who = peer === state.id ? "you" : nameOf(peer);
  const text = peer === state.id ? message : message.replace(peer, who);
  state.refusals.push({ peer, message: text });
  const li = document.createElement("li");
  li.textContent = text;
  $("refusals").appendChild(li);
  $("refusals").hidden = false;
  if (peer === state.id) showError("run-error", text);
  event(text, "error");
});
bus.on("run:log", ({ text }) => event(text));
bus.on("run:restored", (r) => {
  Object.assign(state.run, { step: r.step, sha: r.sha, steps: r.steps, loss: null });
  if (r.by !== state.id) state.checkpoint.restores.push({ by: r.by, step: r.step, sha: r.sha });
  plot.clear();
  renderRun();
});
bus.on("run:error", ({ message }) => {
  state.error = message;
  showError("run-error", message);
  status(message, true);
  event(message, "error");
});

function nameOf(id) {
  return state.room?.members.find((m) => m.id === id)?.name || id;
}

// -- DOM -> actions ----------------------------------------------------------------------------

let net = null;
let mesh = null;
const plot = new LossPlot($("loss-plot"));

function wire() {
  $("create-room").onclick = () => {
    showError("room-error", "");
    net.createRoom();
    history.replaceState(null, "", location.pathname);
  };
  $("join-room").onclick = () => {
    let code;
    try {
      code = normalizeRoom($("join-code").value);
    } catch (err) {
      showError("room-error", err.message);
      return;
    }
    showError("room-error", "");
    net.join(code);
    history.replaceState(null, "", `?room=${code}`);
  };
  $("network-room").onclick = () => {
    showError("room-error", "");
    net.join("network");
    history.replaceState(null, "", location.pathname);
  };
  $("copy-link").onclick = () => navigator.clipboard?.writeText($("room-link").href).catch(() => {});
  $("device-name").onchange = () => {
    const name = $("device-name").value.trim();
    if (!name) return;
    localStorage.setItem("daisychain.name", name);
    state.device.name = name;
    net.update({ name });
    event(`renamed to ${name}`);
  };
  $("start").onclick = () => {
    let settings;
    try {
      settings = readSettings();
    } catch (err) {
      showError("run-error", err.message);
      return;
    }
    showError("run-error", "");
    const resume = state.checkpoint.loaded;
    mesh.start(settings, resume).then(() => {
      if (resume) {
        state.checkpoint.loaded = null;
        checkpointNote(`The run goes on from ${resume.name} (step ${resume.step}).`);
      }
    }).catch((err) => bus.emit("run:error", { message: err.message }));
  };
  $("download-checkpoint").onclick = () => downloadCheckpoint();
  $("upload-checkpoint").onchange = (e) => {
    const file = e.target.files?.[0];
    e.target.value = ""; // choosing the same file again is a new upload
    if (file) uploadCheckpoint(file);
  };
  $("stop").onclick = () => mesh.stop("the host stopped the run");
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
  status("Testing this device (golden vectors through every compute path)…");
  const device = await selfTestDevice({ want: params.get("path") });
  state.device = { ...device, name };
  renderDevice();
  event(`self-test: ${device.reason}`);
  net = new Network(bus, { name, kind: device.kind, capacity: device.capacity, room });
  mesh = new Mesh(bus, net, device);
  window.__daisy.mesh = mesh; // its state, for reading
  wire();
  await net.start();
  state.ready = !!state.room;
  renderSettings();
}

// Closing the only replica of a running run loses it: ask first (the others keep it alive).
window.addEventListener("beforeunload", (e) => {
  const running = ["starting", "running"].includes(state.run.state) && mesh?.hasState();
  const others = Object.values(state.links).some((s) => s === "open");
  if (running && !others) {
    e.preventDefault();
    e.returnValue = "This device holds the only copy of the run. Download a checkpoint first?";
  }
});

main().catch((err) => {
  console.error(err);
  state.error = `${err.name}: ${err.message}`;
  status(`This page could not start: ${err.message}`, true);
});

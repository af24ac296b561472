// The page (index.html): DOM only. It shows what network.js and mesh.js report on the bus
// and turns the user's clicks into calls on them; it never touches RTCPeerConnection.
//
// Every event it renders may never come (an older mesh.js, a peer that left): each part of
// the page falls back to what it can work out from the events it has (bus.js lists them).
//
// window.__daisy exposes the page's state for tests and curious users (read-only use).

import { Mesh, selfTestDevice } from "../shell/mesh.js";
import { Network } from "../shell/network.js";
import { TryPanel } from "./panels/try.js";
import { bus } from "../shell/bus.js";
import { normalizeRoom, roomFromLocation } from "../wire/protocol.js";
import { $, ctx, defaultName, kindName, learnName, nameOf, now, running, state, words } from "./panels/store.js";
import { announce, event, showError, status } from "./panels/events.js";
import { retrying } from "./panels/retry.js";
import { deviceReason, renderDevice } from "./panels/device.js";
import { renderChecklist, renderRoom, renderShare } from "./panels/room.js";
import { renderMatrix, renderPeers } from "./panels/peers.js";
import { applyTaskDefaults, chosenDataset, fieldOf, renderSchedule, showRunSettings, loadDatasets, renderDatasetInfo, renderDatasets, renderSettings, setFieldError, uploadData, validate,
  validateAll } from "./panels/settings.js";
import { chartAdd, newChart } from "./panels/chart_panel.js";
import { mountModelData, renderModelSize } from "./panels/model_data.js";
import { liveAccuracy, newRun, renderCounters, renderRun, renderRunSoon, sayRunEnded } from "./panels/run.js";
import { galleryDone, galleryReset, galleryStep } from "./panels/gallery.js";
import { checkpointNote, downloadCheckpoint, offerTry, showEnd, tryCheckpoint, uploadCheckpoint } from "./panels/end.js";

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
bus.on("run:capacity", ({ capacity }) => { // this device measured on the run's own model
  const micro = ctx.mesh?.peer?.run?.identity?.hyper?.micro_batch ?? state.settingsUsed?.micro_batch ?? 16;
  Object.assign(state.device, { runCapacity: capacity, runMicro: micro });
  state.runMicro = micro;
  event(`measured on the run's model: ${capacity.toFixed(1)} micro-batches/s (the self-test's digits probe: ${state.device.capacity.toFixed(1)})`);
  renderDevice();
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
  if (s.state === "starting" && state.run.state !== "starting") { newRun(); galleryReset(); }
  else if (fresh && !state.runStart) { newRun(); galleryReset(); }
  Object.assign(state.run, s);
  if (s.state === "running" && !state.runStart) state.runStart = { t: now(), step: s.step || 0 };
  // a run that starts from a checkpoint counts its steps from there
  else if (s.state === "running" && state.runStart && !state.times.length && Number.isFinite(s.step)) state.runStart.step = s.step;
  if (s.text) event(s.text, s.state === "refused" || s.state === "failed" ? "error" : "");
  if (["running", "starting"].includes(s.state)) status(s.text || "training");
  if (s.state === "running") { offerTry(); showRunSettings(); renderModelSize(); }
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
  galleryStep(s.step);
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
  galleryDone(s.step);
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
  // "X gets no micro-batch of step N: why" comes at every step: once per device, and again
  // when its reason changes (as daisy-peer's progress.py Repeats)
  const m = /^(.+?) gets no micro-batch of step \d+: (.*)$/.exec(text);
  if (m) {
    const said = (state.noShare ||= {});
    if (said[m[1]] === m[2]) return;
    said[m[1]] = m[2];
  }
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
  // the host's run failed before it began (mesh.start's queued part): back to the settings
  if (state.run.state === "starting" && state.room?.isHost && !ctx.mesh?.peer?.coordinating) {
    backToSettings(message);
    return;
  }
  state.error = words(message);
  showError("run-error", message);
  status(message, true);
  event(message, "error");
});

// -- DOM -> actions ----------------------------------------------------------------------------

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
    ctx.net.join(code);
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
      ctx.net.createRoom();
      history.replaceState(null, "", location.pathname);
    }, "creating the private room");
  };
  $("ask-again").onclick = () => {
    const code = state.denied?.code;
    if (!code) return;
    showError("room-error", "");
    roomAction(() => ctx.net.join(code), `asking to join ${code} again`);
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
      ctx.net.join("network");
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
    ctx.net.update({ name });
    event(`renamed to ${name}`);
  };
  $("f-task").addEventListener("change", () => {
    const ds = chosenDataset();
    const task = $("f-task").value;
    applyTaskDefaults(task, state.task);
    state.task = task;
    if (ds && ds.task !== task) {
      renderDatasets(state.datasets.find((d) => d.origin === "embedded" && d.task === task)?.fingerprint ?? null);
    }
    validate();
  });
  $("f-dataset").addEventListener("change", () => {
    renderDatasetInfo();
    const ds = chosenDataset();
    if (ds && ds.task !== state.task) {
      $("f-task").value = ds.task;
      applyTaskDefaults(ds.task, state.task);
      state.task = ds.task;
    }
    validate();
  });
  $("data-file").addEventListener("change", (e) => {
    const file = e.target.files?.[0];
    if (file) uploadData(file);
  });
  $("settings").addEventListener("input", (e) => {
    if (e.target.name === "data_file") return;
    validate();
    if (["steps", "lr"].includes(e.target.name)) renderSchedule();
    if (["layers", "hidden", "context", "task", "dataset"].includes(e.target.name)) { // the model on its data, once typing stops
      clearTimeout(wire.check);
      wire.check = setTimeout(() => validateAll(), 400);
    }
  });
  $("settings").addEventListener("submit", (e) => { e.preventDefault(); $("start").click(); });
  $("start").onclick = () => start();
  $("download-checkpoint").onclick = () => downloadCheckpoint();
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
    state.editing = true; // the page lays out the next run's settings first
    renderRun();
    $("settings-panel").scrollIntoView({ block: "start" });
    const first = $("settings").querySelector("select:not([disabled]), input:not([disabled])");
    (first || $("settings-title")).focus();
  };
  $("upload-checkpoint").onchange = (e) => {
    const file = e.target.files?.[0];
    e.target.value = ""; // choosing the same file again is a new upload
    if (file) uploadCheckpoint(file);
  };
  $("stop").onclick = () => {
    if (state.run.state === "starting" && state.starting) { // not running yet: back to the settings
      state.starting.cancelled = true;
      backToSettings("you stopped the run before its first step");
    }
    ctx.mesh.stop("the host stopped the run");
  };
  $("log-scale").onchange = (e) => ctx.chart.setLog(e.target.checked);
  // numbers that change with time (step rate, time left) without a new event
  setInterval(() => { if (state.run.state === "running") renderRun(); }, 1000);
}

/** Start: every field checked, then the model on its data (what the run checks, at the
 *  fields), then the run. A failure after Start returns the page to editable settings with
 *  the reason at its field. */
async function start() {
  if (state.starting) return;
  const attempt = state.starting = { cancelled: false };
  $("start").disabled = true;
  status("Checking the settings (the model on its data)…");
  let checked;
  try {
    checked = await validateAll();
  } finally {
    state.starting = null;
    renderSettings();
  }
  const bad = Object.keys(checked.errors);
  if (bad.length) {
    showError("run-error", "Some settings need a fix: see the messages by the fields.");
    status("Some settings need a fix: see the messages by the fields.", true);
    $("settings").elements[bad[0]]?.focus();
    return;
  }
  showError("run-error", "");
  if (typeof Notification === "function" && Notification.permission === "default") {
    Notification.requestPermission().catch(() => {});
  }
  const resume = state.checkpoint.loaded;
  state.settingsUsed = checked.settings;
  state.starting = attempt;
  try {
    await ctx.mesh.start(checked.settings, resume);
    if (attempt.cancelled) return ctx.mesh.stop("the host stopped the run");
    if (resume) {
      state.checkpoint.loaded = null;
      checkpointNote(`The run goes on from ${resume.name} (step ${resume.step}).`);
    }
  } catch (err) {
    if (!attempt.cancelled) backToSettings(err.message);
  } finally {
    if (state.starting === attempt) state.starting = null;
  }
}

/** The run did not start (a refusal after Start, or Stop before its first step): the
 *  settings are editable again and the reason is at its field. */
function backToSettings(message) {
  if (state.run.state === "starting") state.run.state = "idle";
  state.run.text = message;
  state.preparing = null;
  state.starting = null;
  const field = fieldOf(message);
  if (field) setFieldError(field, message);
  bus.emit("run:error", { message: field ? `The run did not start: ${message} (see the field)` : `The run did not start: ${message}` });
  renderRun();
  renderSettings();
  if (field) $("settings").elements[field]?.focus();
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
  const device = await retrying(() => selfTestDevice({ want: params.get("path") }), {
    what: "Loading the self-test", say: (text) => { status(text, true); event(text, "error"); }, timeoutMs: 180_000,
  });
  status("The self-test passed: connecting to the server…");
  state.device = { ...device, name };
  renderDevice();
  event(`self-test: ${deviceReason(device)}`);
  ctx.net = new Network(bus, { name, kind: device.kind, capacity: device.capacity, room });
  ctx.mesh = new Mesh(bus, ctx.net, device);
  window.__daisy.mesh = ctx.mesh; // its state, for reading
  ctx.tryPanel = new TryPanel($("try-panel"));
  window.__tryPanel = ctx.tryPanel; // for tests (not in window.__daisy: it holds a model)
  offerTry();
  wire();
  mountModelData();
  state.task = $("f-task").value;
  applyTaskDefaults(state.task);
  datasets.then(() => { validate(); renderModelSize(); });
  await ctx.net.start();
  state.ready = !!state.room;
  renderSettings();
  renderChecklist();
}

// Closing the only replica of a running run loses it: ask first (the others keep it alive).
window.addEventListener("beforeunload", (e) => {
  const busy = running() && ctx.mesh?.hasState();
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

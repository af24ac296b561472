// The end card (numbers, who computed how much, the command that makes the same hash), trying
// the model, and checkpoints (download, restore).
// A panel of the page: it subscribes to what it shows, owns its part of the DOM and reads the
// store (store.js); a snapshot, a restore and a checkpoint's data are its commands (ui:*).

import * as F from "../ui_format.js";
import { makeHyper, ModelSpec } from "../../engine/spec.js";
import { createTrainer } from "../../shell/worker/trainer_proxy.js";
import { exportCheckpoint, importCheckpoint } from "../../engine/checkpoint.js";
import { $, ctx, dispatch, nameOf, now, state, words } from "./store.js";
import { copyText, event, showError } from "./say.js";
import { bus } from "../../shell/bus.js";

export class EndPanel {
  constructor() {
    // Who may download or restore changes with the host and the run: the settings panel says so.
    bus.on("page:settings", () => renderCheckpoint());
    bus.on("page:checkpoint-note", ({ text }) => checkpointNote(text));
    bus.on("run:state", (s) => { if (s.state === "running") offerTry(); });
    bus.on("page:run-done", (s) => {
      showEnd(s);
      offerTry();
    });
    $("download-checkpoint").onclick = () => downloadCheckpoint();
    $("end-download").onclick = () => downloadCheckpoint();
    $("try-it").onclick = () => {
      $("try-panel").scrollIntoView({ block: "start" });
      $("try-title").focus?.();
    };
    $("try-checkpoint").onchange = (e) => {
      const file = e.target.files?.[0];
      e.target.value = "";
      if (file) tryCheckpoint(file);
    };
    $("copy-command").onclick = () => copyText($("end-command").textContent, "command-feedback");
    $("back-to-settings").onclick = () => {
      $("end-card").hidden = true;
      dispatch("editing", { editing: true }); // the page lays out the next run's settings first
      bus.emit("page:run-changed");
      $("settings-panel").scrollIntoView({ block: "start" });
      const first = $("settings").querySelector("select:not([disabled]), input:not([disabled])");
      (first || $("settings-title")).focus();
    };
    $("upload-checkpoint").onchange = (e) => {
      const file = e.target.files?.[0];
      e.target.value = ""; // choosing the same file again is a new upload
      if (file) uploadCheckpoint(file);
    };
    offerTry();
  }
}

export function identityOfRun() {
  return ctx.mesh?.peer?.identity || ctx.mesh?.peer?.run?.identity || null;
}

function showEnd(d) {
  const r = state.run;
  const t = state.runEnded ? now() - state.runEnded.t : NaN;
  const stepsDone = d.step - (state.runEnded?.step ?? 0);
  const identity = identityOfRun();
  const entry = identity ? state.datasets.find((x) => x.fingerprint === identity.dataset) : null;
  const command = identity ? F.trainCommand(identity, entry?.train_args, d.step) : null;
  if (identity && !entry) { // data another device sent after this page read the list: read it again
    bus.request("page:load-datasets").then(() => {
      const e = state.datasets.find((x) => x.fingerprint === identity.dataset);
      if (e && state.end?.sha === d.sha) {
        dispatch("end:command", { command: F.trainCommand(identity, e.train_args, d.step) });
        $("end-command").textContent = state.end.command;
      }
    });
  }
  const done = { ...(r.done || {}), ...(ctx.mesh?.peer?.doneBy || {}) };
  const rows = Object.fromEntries((state.roomPeers?.rows || []).map((p) => [p.id, p]));
  const ids = [...new Set([...(state.room?.members || []).map((m) => m.id), ...Object.keys(done), ...Object.keys(rows)])];
  const micro = Object.fromEntries(ids.map((id) => [id, done[id] ?? rows[id]?.micro ?? 0]));
  const total = Object.values(micro).reduce((a, b) => a + b, 0);
  dispatch("end", { end: { accuracy: d.accuracy, loss: r.loss, seconds: t, stepsPerSecond: t > 0 ? stepsDone / t : null,
    step: d.step, steps: r.steps, sha: d.sha, command, who: ids.map((id) => ({ id, name: nameOf(id), micro: micro[id] })).sort((a, b) => b.micro - a.micro) } });
  $("end-title").textContent = d.step < (r.steps ?? d.step) ? `The run stopped at step ${d.step}` : "The run is done";
  $("end-accuracy").textContent = F.percent(d.accuracy);
  $("end-loss").textContent = F.loss(r.loss);
  $("end-time").textContent = F.duration(t);
  $("end-rate").textContent = state.end.stepsPerSecond ? `${state.end.stepsPerSecond.toFixed(2)}` : "—";
  $("end-steps").textContent = `${d.step}${r.steps ? ` of ${r.steps}` : ""}`;
  $("end-who").replaceChildren(...state.end.who.map((w) => {
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


/** The try panel on this tab's replica (unless a checkpoint was chosen for it). */
function offerTry() {
  if (state.tryCheckpoint) return;
  const tr = ctx.mesh?.peer?.trainer;
  bus.emit("page:try", { trainer: tr || null, label: tr ? `the run's model as it is now (run ${state.run.runId || "—"})` : "" });
}

/** A downloaded .pt (checked by the server) as the model to try; the run is not touched. */
async function tryCheckpoint(file) {
  $("try-error").textContent = "";
  try {
    const st = await importCheckpoint(new Uint8Array(await file.arrayBuffer()));
    const id = st.identity;
    const ds = await bus.request("ui:load-data", { task: id.task, fingerprint: id.dataset });
    const d = state.device;
    const tr = await createTrainer({ spec: ModelSpec.fromJson(id.model), hyper: makeHyper(id.hyper), dataset: ds,
      luts: d.luts, units: d.units, kind: d.kind });
    tr.theta.set(st.theta);
    dispatch("try-checkpoint", { name: file.name, step: st.step, sha: st.params_sha256 });
    bus.emit("page:try", { trainer: tr, label: `${file.name} (step ${st.step})` });
    event(`trying ${file.name}: the model at step ${st.step}`);
  } catch (err) {
    $("try-error").textContent = `${file.name} cannot be tried: ${err.message}`;
  }
}

// -- checkpoints -------------------------------------------------------------------------------

function renderCheckpoint() {
  const c = state.checkpoint;
  const host = !!state.room?.isHost && !state.pending;
  const noDownload = c.busy || !ctx.mesh?.hasState() || state.run.state === "starting";
  $("download-checkpoint").disabled = noDownload;
  $("end-download").disabled = noDownload;
  $("upload-checkpoint").disabled = c.busy || !host || !state.ready || state.run.state === "starting";
  $("upload-label").title = host ? "" : "Only the host restores the room from a checkpoint.";
  if (c.info) $("checkpoint-info").textContent = words(c.info);
  showError("checkpoint-error", c.error);
}

function checkpointNote(text) {
  dispatch("checkpoint", { info: text, error: null });
  event(text);
  renderCheckpoint();
}

function checkpointError(text) {
  dispatch("checkpoint", { error: text });
  event(text, "error");
  renderCheckpoint();
}

/** Any device holding the run: the replica's state -> a .pt download. */
async function downloadCheckpoint() {
  dispatch("checkpoint", { busy: true, error: null });
  renderCheckpoint();
  try {
    const snap = await bus.request("ui:snapshot");
    const { bytes, filename, params_sha256: sha } = await exportCheckpoint(snap);
    const url = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
    const a = document.createElement("a");
    a.href = url;
    a.download = filename;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
    dispatch("checkpoint:saved", { filename, step: snap.step, sha });
    checkpointNote(`Saved ${filename}: step ${snap.step}, params-sha256 ${sha}.`);
  } catch (err) {
    checkpointError(`The checkpoint could not be made: ${err.message}`);
  } finally {
    dispatch("checkpoint", { busy: false });
    renderCheckpoint();
  }
}

/** The host: a .pt -> checked by the server -> the room restored (or, before a run, the
 *  state the next Start begins from). A bad file changes nothing and says why. */
async function uploadCheckpoint(file) {
  dispatch("checkpoint", { busy: true, error: null });
  renderCheckpoint();
  try {
    const bytes = new Uint8Array(await file.arrayBuffer());
    const restoring = ctx.mesh.canRestore();
    const st = await importCheckpoint(bytes, restoring ? ctx.mesh.peer.identity : null);
    if (restoring) {
      const done = state.run.state === "done";
      const steps = done ? (await bus.request("page:read-settings")).settings.steps : null; // a finished run goes on to the steps set below
      await bus.request("ui:restore", { state: st, steps });
      dispatch("checkpoint:restored", { name: file.name, step: st.step, sha: st.params_sha256 });
      checkpointNote(`${file.name} restored the room: every device continues from step ${st.step} ` +
        `(params-sha256 ${st.params_sha256}).`);
    } else {
      dispatch("checkpoint", { loaded: { ...st, name: file.name } });
      bus.emit("page:fill-settings", { identity: st.identity });
      const f = $("settings").elements;
      if (Number(f.steps.value) < st.step) f.steps.value = String(st.step);
      bus.emit("page:validate");
      checkpointNote(`${file.name} is checked and loaded (${st.identity.task}, step ${st.step}, params-sha256 ` +
        `${st.params_sha256}). Start trains from step ${st.step} to the steps set below.`);
    }
  } catch (err) {
    checkpointError(`${file.name} was not loaded: ${err.message}. Nothing was changed.`);
  } finally {
    dispatch("checkpoint", { busy: false });
    renderCheckpoint();
  }
}

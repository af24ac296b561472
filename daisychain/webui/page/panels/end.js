// The end card (numbers, who computed how much, the command that makes the same hash), trying
// the model, and checkpoints (download, restore).
// A panel of the page (app.js wires the bus to them): it owns its part of the DOM and reads
// the one store (store.js state).

import * as F from "../ui_format.js";
import { makeHyper, ModelSpec } from "../../engine/spec.js";
import { createTrainer } from "../../shell/worker/trainer_proxy.js";
import { exportCheckpoint, importCheckpoint } from "../../engine/checkpoint.js";
import { $, ctx, nameOf, now, state, words } from "./store.js";
import { event, showError } from "./events.js";
import { fillSettings, loadDatasets, readSettings, validate } from "./settings.js";
import { bus } from "../../shell/bus.js";

export function identityOfRun() {
  return ctx.mesh?.peer?.identity || ctx.mesh?.peer?.run?.identity || null;
}

export function showEnd(d) {
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
  const done = { ...(r.done || {}), ...(ctx.mesh?.peer?.doneBy || {}) };
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


/** The try panel on this tab's replica (unless a checkpoint was chosen for it). */
export function offerTry() {
  if (!ctx.tryPanel || state.tryCheckpoint) return;
  const tr = ctx.mesh?.peer?.trainer;
  ctx.tryPanel.use(tr || null, tr ? `the run's model as it is now (run ${state.run.runId || "—"})` : "");
}

/** A downloaded .pt (checked by the server) as the model to try; the run is not touched. */
export async function tryCheckpoint(file) {
  $("try-error").textContent = "";
  try {
    const st = await importCheckpoint(new Uint8Array(await file.arrayBuffer()));
    const id = st.identity;
    const ds = await ctx.mesh.loadData(id.task, id.dataset);
    const d = state.device;
    const tr = await createTrainer({ spec: ModelSpec.fromJson(id.model), hyper: makeHyper(id.hyper), dataset: ds,
      luts: d.luts, units: d.units, kind: d.kind });
    tr.theta.set(st.theta);
    state.tryCheckpoint = { name: file.name, step: st.step, sha: st.params_sha256 };
    ctx.tryPanel.use(tr, `${file.name} (step ${st.step})`);
    event(`trying ${file.name}: the model at step ${st.step}`);
  } catch (err) {
    $("try-error").textContent = `${file.name} cannot be tried: ${err.message}`;
  }
}

// -- checkpoints -------------------------------------------------------------------------------

// Who may download or restore changes with the host and the run: the settings panel says so.
bus.on("page:settings", () => renderCheckpoint());

export function renderCheckpoint() {
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

export function checkpointNote(text) {
  state.checkpoint.info = text;
  state.checkpoint.error = null;
  event(text);
  renderCheckpoint();
}

export function checkpointError(text) {
  state.checkpoint.error = text;
  event(text, "error");
  renderCheckpoint();
}

/** Any device holding the run: the replica's state -> a .pt download. */
export async function downloadCheckpoint() {
  state.checkpoint.busy = true;
  state.checkpoint.error = null;
  renderCheckpoint();
  try {
    const snap = await ctx.mesh.snapshot();
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
export async function uploadCheckpoint(file) {
  state.checkpoint.busy = true;
  state.checkpoint.error = null;
  renderCheckpoint();
  try {
    const bytes = new Uint8Array(await file.arrayBuffer());
    const restoring = ctx.mesh.canRestore();
    const st = await importCheckpoint(bytes, restoring ? ctx.mesh.peer.identity : null);
    if (restoring) {
      const done = state.run.state === "done";
      const steps = done ? readSettings().settings.steps : null; // a finished run goes on to the steps set below
      await ctx.mesh.restore(st, steps);
      state.checkpoint.restores.push({ name: file.name, step: st.step, sha: st.params_sha256 });
      checkpointNote(`${file.name} restored the room: every device continues from step ${st.step} ` +
        `(params-sha256 ${st.params_sha256}).`);
    } else {
      state.checkpoint.loaded = { ...st, name: file.name };
      fillSettings(st.identity);
      const f = $("settings").elements;
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

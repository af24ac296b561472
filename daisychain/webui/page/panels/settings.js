// The run settings: data sets, an uploaded file, every field checked as `daisychain train` does.
// A panel of the page: it subscribes to what it shows, owns its part of the DOM and reads the
// store (store.js); Start and Stop are its commands (ui:start, ui:stop: mesh.js), and it
// answers the other panels' page:validate, page:fill-settings, page:load-datasets and
// page:read-settings.

import * as F from "../ui_format.js";
import { checkSize, isTransformer, makeHyper, modelFor, parseLayers, recipeSettings } from "../../engine/spec.js";
import { checkSetting } from "../../engine/settings_check.js";
import { TASK_DEFAULTS, taskDefaults } from "../../engine/task_defaults.js";
import { postUpload, withCredential } from "../../shell/uploads.js";
import { settingsOf } from "../../engine/checkpoint.js";
import { $, chosenDataset, ctx, dispatch, running, state, words } from "./store.js";
import { event, showError, status } from "./say.js";
import { retrying } from "./retry.js";
import { bus } from "../../shell/bus.js";

export class SettingsPanel {
  /** `datasets`: the first loadDatasets() (started before the self-test). */
  constructor({ datasets }) {
    for (const ev of ["page:room", "page:run", "page:ready"]) bus.on(ev, () => renderSettings());
    bus.on("run:state", (s) => { if (s.state === "running") showRunSettings(); });
    bus.on("run:error", ({ message }) => {
      // the host's run failed before it began (mesh.start's queued part): back to the settings
      if (state.run.state === "starting" && state.room?.isHost && !ctx.mesh?.peer?.coordinating) {
        backToSettings(message);
        return;
      }
      dispatch("error", { message: words(message) });
      showError("run-error", message);
      status(message, true);
      event(message, "error");
    });
    bus.on("page:datasets", ({ select }) => renderDatasets(select));
    bus.on("page:validate", () => validate());
    bus.on("page:fill-settings", ({ identity, steps = null }) => fillSettings(identity, steps));
    bus.on("page:load-datasets", () => loadDatasets());
    bus.on("page:read-settings", () => readSettings());
    this.wire();
    dispatch("task", { task: $("f-task").value });
    applyTaskDefaults(state.task);
    datasets.then(() => { validate(); bus.emit("page:datasets-loaded"); });
  }

  wire() {
    $("f-task").addEventListener("change", () => {
      const ds = chosenDataset();
      const task = $("f-task").value;
      applyTaskDefaults(task, state.task);
      dispatch("task", { task });
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
        dispatch("task", { task: ds.task });
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
        clearTimeout(this.check);
        this.check = setTimeout(() => validateAll(), 400);
      }
    });
    $("settings").addEventListener("submit", (e) => { e.preventDefault(); $("start").click(); });
    $("start").onclick = () => start();
    $("stop").onclick = () => {
      if (state.run.state === "starting" && state.starting) { // not running yet: back to the settings
        dispatch("start-cancelled");
        backToSettings("you stopped the run before its first step");
      }
      bus.emit("ui:stop", { reason: "the host stopped the run" });
    };
  }
}

/** Start: every field checked, then the model on its data (what the run checks, at the
 *  fields), then the run. A failure after Start returns the page to editable settings with
 *  the reason at its field. */
async function start() {
  if (state.starting) return;
  const attempt = { cancelled: false };
  dispatch("starting", { attempt });
  $("start").disabled = true;
  status("Checking the settings (the model on its data)…");
  let checked;
  try {
    checked = await validateAll();
  } finally {
    dispatch("starting", { attempt: null });
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
  dispatch("settings-used", { settings: checked.settings });
  dispatch("starting", { attempt });
  try {
    await bus.request("ui:start", { settings: checked.settings, resume });
    if (attempt.cancelled) return bus.emit("ui:stop", { reason: "the host stopped the run" });
    if (resume) {
      dispatch("checkpoint", { loaded: null });
      bus.emit("page:checkpoint-note", { text: `The run goes on from ${resume.name} (step ${resume.step}).` });
    }
  } catch (err) {
    if (!attempt.cancelled) backToSettings(err.message);
  } finally {
    if (state.starting === attempt) dispatch("starting", { attempt: null });
  }
}

/** The run did not start (a refusal after Start, or Stop before its first step): the
 *  settings are editable again and the reason is at its field. */
function backToSettings(message) {
  dispatch("not-started", { message });
  const field = fieldOf(message);
  if (field) setFieldError(field, message);
  bus.emit("run:error", { message: field ? `The run did not start: ${message} (see the field)` : `The run did not start: ${message}` });
  bus.emit("page:run-changed");
  renderSettings();
  if (field) $("settings").elements[field]?.focus();
}

// -- settings, datasets, uploads --------------------------------------------------------------

export const FIELDS = ["dataset", "data_file", "task", "steps", "layers", "hidden", "context", "batch", "micro_batch", "lr", "seed",
  "replicas", "sync_every", "outer_lr", "outer_momentum", "verify_rate", "aggregate"];

function renderSettings() {
  const host = !!state.room?.isHost && !state.pending;
  const busy = running();
  const guestOfRun = !host && state.runSettings && ["starting", "running", "done"].includes(state.run.state);
  const role = host ? "host" : "guest";
  if ($("main").dataset.role !== role) $("main").dataset.role = role;
  $("start").disabled = !host || busy || !state.ready;
  $("stop").disabled = !host || !busy;
  for (const el of $("settings").elements) el.disabled = !host || busy;
  bus.emit("page:settings", { host, busy });
  $("settings-hint").textContent = guestOfRun
    ? `The settings of run ${state.runSettings.runId}, as the host chose them (read-only here): every device trains this model.`
    : host ? "You are the host: choose the data and the model and start; every device trains the same model."
      : "The host chooses these settings and starts the run.";
}

export function datasetLabel(d) {
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

export async function loadDatasets() {
  try {
    const body = await retrying(async () => {
      const resp = await fetch("/datasets", { cache: "no-store", headers: withCredential() });
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      return resp.json();
    }, { what: "Loading the list of data", tries: 6, say: (text) => { $("dataset-info").textContent = text; } });
    dispatch("datasets", { datasets: Array.isArray(body.datasets) ? body.datasets : [],
      maxUpload: Number.isFinite(body.max_upload_bytes) ? body.max_upload_bytes : null });
  } catch (err) {
    console.warn(`datasets: /datasets did not answer (${err.message}); the embedded sets only`);
  }
  dispatch("datasets:loaded");
  renderDatasets();
  $("data-file-hint").textContent = state.maxUpload
    ? `at most ${F.count(state.maxUpload / 1024)} KiB; the server turns it into the text task's data (as daisychain train --data FILE)`
    : "the server turns it into the text task's data (as daisychain train --data FILE)";
}

export const UPLOAD_NAME = /^[A-Za-z0-9][A-Za-z0-9._ -]{0,79}$/;

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
    const resp = await postUpload(`/datasets/upload?name=${encodeURIComponent(file.name)}`, file, { "Content-Type": "application/octet-stream" });
    if (!resp.ok) {
      const why = (await resp.text()).trim() || `HTTP ${resp.status}`;
      throw new Error(why.replace(/^\d{3}: [A-Za-z ]+\s*/, ""));
    }
    const entry = await resp.json();
    dispatch("datasets:uploaded", { entry });
    if (entry.task !== $("f-task").value) applyTaskDefaults(entry.task, $("f-task").value);
    dispatch("task", { task: entry.task });
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
  dispatch("field-error", { name, text });
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
  const num = (name, label) => { // the ranges of daisychain/engine/settings.py (settings_check.js)
    const { value, error } = checkSetting(name, f[name].value);
    if (error) errors[name] = `${label} ${error}`;
    return value;
  };
  const steps = num("steps", "steps");
  const seed = num("seed", "the seed");
  const batch = num("batch", "the batch");
  const micro = num("micro_batch", "the micro-batch");
  const hidden = num("hidden", "hidden");
  // the text task's --context (model_data.js's slider and field); other tasks have none
  const context = f.context && f.task.value === "text" ? num("context", "the context") : null;
  const lr = num("lr", "the learning rate");
  const local = { // local steps (engine/local.js); 1 and 1: the synchronous run
    replicas: num("replicas", "replicas"), sync_every: num("sync_every", "sync every"),
    outer_lr: num("outer_lr", "the outer learning rate"), outer_momentum: num("outer_momentum", "the outer momentum"),
  };
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
  if (layers && isTransformer(layers)) { // data.py model_for's words, for the page
    if (task !== "text") errors.layers = `transformer blocks read a text (task text), not the ${task} task`;
  } else if (layers && task !== "image" && layers.some((t) => typeof t === "string")) {
    errors.layers = `conv and pool layers need an image input (task image); the ${task} task takes dense widths only`;
  }
  const ds = chosenDataset();
  if (state.datasets.length && !ds) errors.dataset = "choose the data to train on";
  else if (ds && ds.task !== task) errors.dataset = `${ds.name} is data of the ${ds.task} task, not ${task}`;
  if (state.fieldErrors.data_file) errors.data_file = state.fieldErrors.data_file;
  // the room's spot-checks and aggregation (plain choices; daisy-peer's --verify-rate / --aggregate)
  const verifyRate = f.verify_rate ? Number(f.verify_rate.value) : 0.05;
  const aggregate = f.aggregate ? f.aggregate.value : "auto";
  if (aggregate === "ring" && verifyRate > 0) {
    errors.aggregate = "ring needs spot-checks off: a ring hides each contribution from them";
  }
  // the data is fetched windowed with the context when it is not the chosen set's own
  const ownContext = ds?.kind === "tokens" && Array.isArray(ds.input) ? ds.input[0] : 8;
  const settings = { task, steps, seed, batch, micro_batch: micro, lr, hidden, layers, dataset: ds, ...local,
    verify_rate: verifyRate, aggregate, context: context !== null && context !== ownContext ? context : null };
  return { settings, errors };
}

function validate() {
  const { settings, errors } = readSettings();
  for (const name of FIELDS) if (name !== "data_file") setFieldError(name, errors[name] || "");
  return { settings, errors };
}

/** The field a run's refusal names (mesh.start's and spec.js's words), or null. */
export function fieldOf(message) {
  const m = String(message);
  if (/layer|conv|pool|image input|too small|hidden width/i.test(m)) return $("f-layers").value.trim() ? "layers" : "hidden";
  if (/--hidden/.test(m)) return "hidden";
  if (/context/.test(m)) return "context";
  if (/micro-batch|--batch/.test(m)) return "batch";
  if (/--lr|learning rate|warm-up/.test(m)) return "lr";
  if (/steps|checkpoint/.test(m)) return "steps";
  if (/data|fingerprint/i.test(m)) return "dataset";
  return null;
}

/** What mesh.start checks once Start is clicked (the data, the model on it, the recipe),
 *  checked before: {field: reason}, empty when the run can start. It fetches the chosen data
 *  as the run would (mesh.loadData keeps it for the run). */
export async function preflight(settings) {
  const errors = {};
  const { task, steps, seed, batch, micro_batch, lr, layers, hidden, dataset, context } = settings;
  try {
    makeHyper({ seed, batch, micro_batch, lr, ...recipeSettings(dataset?.task || task, steps) });
  } catch (err) {
    errors[fieldOf(err.message) || "lr"] = err.message;
  }
  let ds;
  try {
    ds = await bus.request("ui:load-data", { task: dataset?.task || task, fingerprint: dataset?.fingerprint || null,
      name: dataset?.name || null, context: context ?? null });
  } catch (err) {
    errors[/context/.test(err.message) ? "context" : "dataset"] = `the data did not load: ${err.message}`;
    return errors;
  }
  try {
    const spec = modelFor(ds, layers ?? (ds.kind === "image" ? null : hidden), 16);
    checkSize(spec, { micro_batch }); // a transformer's attention scores of one micro-batch
  } catch (err) {
    errors[layers ? "layers" : "hidden"] = err.message.replace(/^--layers:? ?/, "");
  }
  return errors;
}

/** The fields' own errors and the model's on its data (preflight), shown by the fields;
 *  the errors of both. A later check asks again: only the last answer is shown. */
async function validateAll() {
  const { settings, errors } = validate();
  const token = (validateAll.token = (validateAll.token || 0) + 1);
  if (Object.keys(errors).length || !ctx.mesh) return { settings, errors };
  const more = await preflight(settings);
  if (token === validateAll.token) for (const [k, v] of Object.entries(more)) setFieldError(k, v);
  return { settings, errors: { ...errors, ...more } };
}

// -- the task's defaults (engine/task_defaults.json: the table every command reads) ------------

const TASK_FIELDS = ["steps", "lr"];

/** Choosing a task fills its defaults (steps, learning rate) into the fields still holding
 *  the last task's defaults; a value the host typed stays. */
function applyTaskDefaults(task, previous = null) {
  const f = $("settings").elements;
  const was = previous ? taskDefaults(previous) : null;
  const now = taskDefaults(task);
  for (const name of TASK_FIELDS) {
    const v = f[name].value.trim();
    if (!was || v === "" || Number(v) === was[name]) f[name].value = String(now[name]);
  }
  $("hint-layers-empty").textContent = task === "image"
    ? `empty: the task's CNN, ${now.layers}` : "empty: one layer of Hidden";
  renderSchedule();
}

/** What the learning rate means for the run: the schedule the run's recipe gives it (the
 *  task's defaults, or `recipe`: a run's own augment_shift, lr_warmup, lr_decay_steps). */
function renderSchedule(recipe = null) {
  const f = $("settings").elements;
  const task = f.task.value;
  const steps = checkSetting("steps", f.steps.value).value;
  const lr = checkSetting("lr", f.lr.value).value;
  if (!Number.isFinite(steps) || !Number.isFinite(lr) || steps < 1) { $("hint-lr").textContent = ""; return; }
  const d = recipe || taskDefaults(TASK_DEFAULTS[task] ? task : "digits", steps);
  const parts = [];
  if (d.lr_warmup) parts.push(`rises from 0 to ${lr} over the first ${F.count(d.lr_warmup)} steps`);
  if (d.lr_decay_steps) parts.push(`${parts.length ? "then falls" : "falls"} linearly to 0 at step ${F.count(d.lr_decay_steps)}`);
  let text = parts.length ? `${parts.join(", ")}` : "constant through the run";
  if (d.augment_shift) text += `; each training image shifted by up to ${d.augment_shift} px (the image recipe)`;
  $("hint-lr").textContent = text;
}

/** Fill the form with the settings of a run identity (a loaded checkpoint's, or the run this
 *  device trains in): the data, the task, the model, the numbers, the recipe's schedule. */
function fillSettings(identity, steps = null) {
  const s = settingsOf(identity);
  const f = $("settings").elements;
  if (s.task) {
    dispatch("task", { task: s.task });
    f.task.value = s.task;
  }
  for (const [k, v] of Object.entries(s)) {
    if (k === "layers" || k === "task") continue;
    if (v !== null && v !== undefined && f[k] && f[k].type !== "file") f[k].value = String(v);
  }
  // one dense width is `hidden`; anything else (two widths, convs, a single transformer block)
  // is the layers field's
  const oneWidth = s.layers && s.layers.length === 1 && typeof s.layers[0] === "number";
  f.layers.value = s.layers && !oneWidth ? s.layers.join(",") : "";
  if (steps !== null) f.steps.value = String(steps);
  const known = state.datasets.find((d) => d.fingerprint === identity.dataset);
  if (known || !identity.dataset) {
    renderDatasets(known?.fingerprint ?? state.datasets.find((d) => d.origin === "embedded" && d.task === s.task)?.fingerprint);
  } else { // data this page's list does not name (sent to the host's server meanwhile)
    const o = document.createElement("option");
    o.value = identity.dataset;
    o.textContent = `the run's data (${s.task}, fingerprint ${identity.dataset.slice(0, 12)}…)`;
    $("f-dataset").replaceChildren(o);
    $("dataset-info").textContent = o.textContent;
  }
  renderSchedule({ augment_shift: s.augment_shift, lr_warmup: s.lr_warmup, lr_decay_steps: s.lr_decay_steps });
}

/** A guest shows the run's own settings, read-only (the host's form is its own). */
function showRunSettings() {
  const run = ctx.mesh?.peer?.run;
  const host = !!state.room?.isHost;
  if (host || !run?.identity || state.runSettings?.runId === state.run.runId) return;
  dispatch("run-settings", { runId: state.run.runId || ctx.mesh.peer.runId });
  fillSettings(run.identity, run.steps ?? null);
  for (const name of FIELDS) setFieldError(name, "");
  renderSettings();
}

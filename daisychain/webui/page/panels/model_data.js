// Two additions to the run settings, in their own panel file (settings.js keeps the form):
//
// * Model size sliders: the depth and width of the hidden layers write the --layers field, and
//   the parameter count and memory of the model they make on the chosen data show as they
//   move. The count is the spec's (engine/spec.js modelFor, the function the run builds its
//   model with); the memory is what every device holds for it: the parameters and Adam's two
//   moments, float64 each (24 bytes a parameter).
// * The text task's context (`--context`): a slider and a field with the range of the one
//   settings table (settings_table.js SETTINGS, held to engine/settings.py by
//   tests/data/settings_values.json). The count follows it; the run fetches the data windowed with
//   it (`/data/text.dcds?context=N`, server/routes/data.py), the data `train --context N` makes.
// * A Hugging Face data set by name: the host types owner/name and the rows to read; the
//   server fetches them (`daisychain serve --hub`, server/routes/hub.py) and keeps the set for
//   the room like an uploaded file, under the room credential and quotas.
//
// * A task of your own that the server serves (`serve --task module:Name`) can be chosen: its
//   name joins the task list and its data set fills in its layers.
//
// It builds its own DOM after the layers field (index.html is not touched) and reads the one
// store (store.js state); ModelDataPanel builds it once and subscribes to what redraws it.

import * as F from "../ui_format.js";
import { modelFor, parseLayers } from "../../engine/spec.js";
import { postUpload } from "../../shell/uploads.js";
import { checkSetting } from "../../engine/settings_check.js";
import { SETTINGS } from "../../engine/settings_table.js";
import { $, chosenDataset, dispatch, state } from "./store.js";
import { event } from "./say.js";
import { bus } from "../../shell/bus.js";

const validate = () => bus.emit("page:validate"); // the settings panel checks the fields

export class ModelDataPanel {
  constructor() {
    mountModelData();
    bus.on("run:state", (s) => { if (s.state === "running") renderModelSize(); });
    bus.on("page:datasets-loaded", () => renderModelSize());
  }
}

export const BYTES_PER_PARAM = 24; // theta, Adam m and v: float64 each
export const DEPTH = { min: 1, max: 4 };
export const WIDTHS = [8, 16, 32, 64, 128, 256, 512, 1024];

function el(tag, props = {}, children = []) {
  const e = document.createElement(tag);
  Object.assign(e, props);
  for (const c of children) e.append(c);
  return e;
}

/** A /datasets entry as the shape modelFor reads (the data's kind, input and classes);
 *  `context`: a text set's windows that long instead of its own. */
export function entryShape(d, context = null) {
  if (!d || !Array.isArray(d.input)) return null;
  const input = d.kind === "tokens" && context !== null ? [context] : d.input;
  return { kind: d.kind, task: d.task, classes: d.classes, x_train: { shape: [0, ...input] },
    meta: { image_shape: d.image_shape, loss: d.loss } };
}

/** The hidden layers the sliders say: `depth` dense widths, or for an image task `depth`
 *  conv blocks (convW,pool) then nothing more. */
export function sliderLayers(kind, depth, width) {
  const items = [];
  for (let i = 0; i < depth; i++) items.push(...(kind === "image" ? [`conv${width}`, "pool"] : [width]));
  return items.join(",");
}

/** {params, bytes, text} of the model the form's settings make on the chosen data, or
 *  {error} in words. */
export function modelSize() {
  const f = $("settings").elements;
  const { value: context, error } = checkSetting("context", f.context?.value ?? "8");
  if (chosenDataset()?.kind === "tokens" && error) return { error: `the context ${error}` };
  const ds = entryShape(chosenDataset(), context);
  if (!ds) return { error: "choose the data first" };
  try {
    const lt = f.layers.value.trim();
    const layers = lt ? parseLayers(lt) : null;
    const hidden = Number(f.hidden.value) || 128;
    const spec = modelFor(ds, layers ?? (ds.kind === "image" ? null : hidden), 16);
    const params = spec.paramShapes().reduce((s, [, sh]) => s + sh.reduce((a, b) => a * b, 1), 0);
    const bytes = params * BYTES_PER_PARAM;
    const mib = bytes / (1 << 20);
    return { params, bytes, text: `${F.count(params)} parameters · ${mib < 0.1 ? (bytes / 1024).toFixed(1) + " KiB" : mib.toFixed(1) + " MiB"} on every device (parameters and Adam's moments, float64)` };
  } catch (err) {
    return { error: err.message.replace("--layers takes", "takes") };
  }
}

/** A data set of a task of your own (`serve --task module:Name`) can be chosen: the task
 *  list gains its name, as the built-in tasks are listed. */
function offerOwnTasks() {
  const sel = $("f-task");
  const have = new Set([...sel.options].map((o) => o.value));
  for (const d of state.datasets) {
    if (have.has(d.task)) continue;
    sel.append(el("option", { value: d.task, textContent: `${d.task} (a task of your own)` }));
    have.add(d.task);
  }
}

/** Choosing a task's data set fills in the task's model (its `layers`), as `--task` does. */
function onDataset() {
  const d = chosenDataset();
  if (d?.kind === "tokens" && Array.isArray(d.input)) setContext(d.input[0]); // the set's own
  if (!d || typeof d.layers !== "string") return renderModelSize();
  $("settings").elements.layers.value = d.layers;
  validate();
  renderModelSize();
}

function renderModelSize() {
  const out = $("model-size");
  if (!out) return;
  offerOwnTasks();
  const got = modelSize();
  out.textContent = got.error ? `— (${got.error})` : got.text;
  out.dataset.params = got.error ? "" : String(got.params);
  out.dataset.bytes = got.error ? "" : String(got.bytes);
  const kind = chosenDataset()?.kind;
  $("depth-label").textContent = kind === "image" ? "Conv blocks" : "Hidden layers";
  const { value, error } = checkSetting("context", $("f-context").value);
  $("context-field").hidden = $("settings").elements.task.value !== "text";
  if (!error) $("f-context-slider").value = String(value); // a value filled in (a run's settings)
}

function setContext(n) {
  $("f-context").value = $("f-context-slider").value = String(n);
  validate();
}

function onSlider() {
  const kind = chosenDataset()?.kind || "dense";
  const depth = Number($("f-depth").value);
  const width = WIDTHS[Number($("f-width").value)];
  $("depth-value").textContent = String(depth);
  $("width-value").textContent = String(width);
  $("settings").elements.layers.value = sliderLayers(kind, depth, width);
  validate();
  renderModelSize();
}

async function fetchHub() {
  const name = $("hub-name").value.trim();
  const take = $("hub-take").value.trim();
  const task = $("settings").elements.task.value === "image" ? "image" : "text";
  const say = (text, bad = false) => { $("hub-hint").textContent = text; $("hub-hint").className = bad ? "field-error" : "hint"; };
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]*(\/[A-Za-z0-9][A-Za-z0-9._-]*)?$/.test(name)) return say("give a data set name such as owner/name", true);
  say(`the server is reading the first ${take} rows of ${name}…`);
  $("hub-fetch").disabled = true;
  try {
    const q = new URLSearchParams({ name, take, task });
    const resp = await postUpload(`/datasets/hub?${q}`, null);
    if (!resp.ok) throw new Error((await resp.text()).trim() || `HTTP ${resp.status}`);
    const entry = await resp.json();
    dispatch("datasets:uploaded", { entry });
    $("settings").elements.task.value = entry.task;
    bus.emit("page:datasets", { select: entry.fingerprint });
    say(`${entry.name}: ${F.count(entry.train)} training and ${F.count(entry.test)} test samples, ` +
      `fingerprint ${entry.fingerprint.slice(0, 12)}…`);
    event(`${entry.name} (first ${take} rows) is on the server for this room`);
    validate();
    renderModelSize();
  } catch (err) {
    say(`${name} was not fetched: ${err.message}`, true);
  } finally {
    $("hub-fetch").disabled = false;
  }
}

function mountModelData() {
  const layersField = $("f-layers")?.closest(".field");
  if (!layersField || $("model-size-field")) return;
  const depth = el("input", { id: "f-depth", type: "range", min: DEPTH.min, max: DEPTH.max, step: 1, value: 1 });
  const width = el("input", { id: "f-width", type: "range", min: 0, max: WIDTHS.length - 1, step: 1, value: WIDTHS.indexOf(128) });
  depth.setAttribute("aria-describedby", "model-size");
  width.setAttribute("aria-describedby", "model-size");
  const sizeField = el("div", { id: "model-size-field", className: "field span2" }, [
    el("label", { htmlFor: "f-depth", id: "depth-label", textContent: "Hidden layers" }),
    el("div", { className: "row" }, [depth, el("output", { id: "depth-value", textContent: "1" })]),
    el("label", { htmlFor: "f-width", textContent: "Width" }),
    el("div", { className: "row" }, [width, el("output", { id: "width-value", textContent: "128" })]),
    el("small", { className: "hint", id: "model-size", role: "status" }),
  ]);
  const hubName = el("input", { id: "hub-name", type: "text", placeholder: "owner/name", spellcheck: false });
  const hubTake = el("input", { id: "hub-take", type: "number", min: 1, value: 2000, inputMode: "numeric" });
  const hubFetch = el("button", { id: "hub-fetch", type: "button", textContent: "Fetch" });
  const hubField = el("div", { id: "hub-field", className: "field span2" }, [
    el("label", { htmlFor: "hub-name", textContent: "Or a Hugging Face data set (the server fetches its first rows)" }),
    el("div", { className: "row" }, [hubName, hubTake, hubFetch]),
    el("small", { className: "hint", id: "hub-hint", textContent: "a server started with daisychain serve --hub fetches it for this room" }),
  ]);
  const [, lo, hi] = SETTINGS.context; // --context's range (engine/settings.py SETTINGS)
  const ctxSlider = el("input", { id: "f-context-slider", type: "range", min: lo, max: hi, step: 1, value: 8 });
  const ctxBox = el("input", { id: "f-context", name: "context", type: "number", value: 8, inputMode: "numeric" });
  ctxSlider.setAttribute("aria-describedby", "model-size");
  ctxBox.setAttribute("aria-describedby", "err-context model-size");
  const contextField = el("div", { id: "context-field", className: "field span2", hidden: true }, [
    el("label", { htmlFor: "f-context", textContent: `Context: characters the model reads (--context, ${lo} to ${hi})` }),
    el("div", { className: "row" }, [ctxSlider, ctxBox]),
    el("small", { className: "field-error", id: "err-context", role: "alert" }),
  ]);
  layersField.after(sizeField, contextField, hubField);
  ctxSlider.addEventListener("input", () => setContext(ctxSlider.value));
  depth.addEventListener("input", onSlider);
  width.addEventListener("input", onSlider);
  hubFetch.addEventListener("click", fetchHub);
  for (const box of [hubName, hubTake]) {
    box.addEventListener("keydown", (e) => { // Enter fetches; it never submits the form (= Start)
      if (e.key === "Enter") { e.preventDefault(); fetchHub(); }
    });
  }
  $("f-dataset").addEventListener("change", onDataset);
  // the count follows every change of the form (a typed --layers, the data, the task)
  $("settings").addEventListener("input", renderModelSize);
  $("settings").addEventListener("change", renderModelSize);
  renderModelSize();
}

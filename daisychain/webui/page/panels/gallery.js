// The gallery of an image run: a grid of fixed test images with the model's predicted class
// (wrong ones marked by colour and by a cross and the words "should be K"), refreshed every few
// steps while the run goes and at its end; the end card's confusion matrix (true class x
// predicted class over the whole test set). Predictions are computed in the compute worker
// (worker/predictions.js) on a copy of the parameters: the run's hash does not change.
// A panel of the page that subscribes to the bus itself: it owns #gallery-panel and #end-confusion,
// and state.galleryShown (the steps whose predictions the grid has shown, for tests).

import * as F from "../ui_format.js";
import { confusionOf, predictRows } from "../../shell/worker/predictions.js";
import { $, ctx, dispatch, state } from "./store.js";
import { galleryView } from "./eval_budget.js";
import { bus } from "../../shell/bus.js";

const { className } = F;

export class GalleryPanel {
  constructor() {
    bus.on("page:new-run", ({ gallery }) => { if (gallery) galleryReset(); });
    bus.on("run:step", (s) => galleryStep(s.step));
    bus.on("run:done", (s) => galleryDone(s.step));
  }
}

/** Test images the gallery shows. */
export const GALLERY_SIZE = 24;

/** Every this many steps the gallery's predictions are computed again (about 20 a run). */
export function galleryEvery(steps) {
  return Math.max(5, Math.ceil((Number(steps) || 0) / 20));
}

/** `count` test rows spread evenly over a split of `n` (the same ones for the whole run). */
export function galleryIndex(n, count = GALLERY_SIZE) {
  const k = Math.min(count, n);
  return Array.from({ length: k }, (_, i) => Math.floor((i * n) / k));
}

let g = null; // {tr, index, next, busy, pred, step}

function imageShape(ds) {
  const s = ds.meta && Array.isArray(ds.meta.image_shape) ? ds.meta.image_shape.map(Number) : null;
  return s && s.length === 3 && s.every((v) => Number.isInteger(v) && v > 0) ? s : null;
}

/** Draw row `i` of a (N, c*h*w) uint8 split, laid out channels first, into a new canvas. */
function drawRow(x, i, [c, h, w]) {
  const cv = document.createElement("canvas");
  cv.width = w;
  cv.height = h;
  const img = cv.getContext("2d").createImageData(w, h);
  const base = i * c * h * w;
  for (let p = 0; p < h * w; p++) {
    const r = x[base + p];
    img.data[4 * p] = r;
    img.data[4 * p + 1] = c >= 3 ? x[base + h * w + p] : r;
    img.data[4 * p + 2] = c >= 3 ? x[base + 2 * h * w + p] : r;
    img.data[4 * p + 3] = 255;
  }
  cv.getContext("2d").putImageData(img, 0, 0);
  return cv;
}

function trainerNow() {
  const tr = ctx.mesh?.peer?.trainer;
  const shape = tr && tr.ds && tr.ds.kind === "image" ? imageShape(tr.ds) : null;
  return shape && shape[0] * shape[1] * shape[2] === tr.rowLen ? tr : null; // a row is one image
}

/** Build the grid for the run's trainer (once per trainer); hide the panel for other data. */
function ensure() {
  const tr = trainerNow();
  if (!tr) {
    if (!g) $("gallery-panel").hidden = true;
    return g;
  }
  if (g && g.tr === tr) return g;
  const ds = tr.ds;
  const shape = imageShape(ds);
  g = { tr, index: galleryIndex(ds.y_test.data.length), next: 0, busy: false, pred: null, step: null };
  $("gallery").replaceChildren(...g.index.map((row, k) => {
    const fig = document.createElement("figure");
    fig.className = "g-item";
    fig.dataset.row = String(row);
    fig.dataset.label = String(ds.y_test.data[row]);
    const cv = drawRow(ds.x_test.data, row, shape);
    cv.setAttribute("role", "img");
    cv.setAttribute("aria-label", `test image ${k + 1}, a ${className(ds, ds.y_test.data[row])}`);
    const cap = document.createElement("figcaption");
    cap.textContent = "…";
    fig.append(cv, cap);
    fig.tabIndex = 0; // a pick for "Try the model": the panel shows every class's probability
    fig.title = "try the model on this image";
    const pick = () => bus.emit("page:try-row", { row });
    fig.onclick = pick;
    fig.onkeydown = (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); pick(); } };
    return fig;
  }));
  $("gallery-note").textContent = `${g.index.length} of the ${F.count(ds.y_test.data.length)} test images; ` +
    "the model's answer under each, not yet computed; pick one to try the model on it.";
  $("gallery-panel").hidden = false;
  return g;
}

function render(at) {
  const ds = at.tr.ds;
  const figs = $("gallery").children;
  let right = 0;
  at.index.forEach((row, k) => {
    const fig = figs[k];
    const p = at.pred[k];
    const truth = ds.y_test.data[row];
    const ok = p === truth;
    if (ok) right++;
    fig.classList.toggle("wrong", !ok);
    fig.classList.toggle("right", ok);
    fig.dataset.pred = String(p);
    fig.lastChild.textContent = ok ? `✓ ${className(ds, p)}` : `✗ ${className(ds, p)} (should be ${className(ds, truth)})`;
  });
  dispatch("gallery:shown", { step: at.step });
  $("gallery-note").textContent = `The model at step ${at.step}: ${right} of these ${at.index.length} test images right; ` +
    "a wrong answer is marked ✗, in red, with the true class.";
}

async function predictNow(at, theta = at.tr.theta.slice()) {
  const tr = at.tr;
  return typeof tr.predictions === "function" ? tr.predictions("test", at.index, theta)
    : predictRows(tr, theta, "test", at.index); // no module workers: on the page
}

/** The grid's predictions at `step` (if due and none is being computed). */
function galleryStep(step, force = false) {
  const at = ensure();
  if (!at || at.busy || (!force && (step < at.next || !galleryView.due(at.taken || 0)))) return null;
  at.busy = true;
  at.taken = (at.taken || 0) + 1;
  at.next = step + galleryEvery(state.run.steps);
  const theta = at.tr.theta.slice(); // this step's parameters, whenever the view runs
  return (force ? predictNow(at, theta) : galleryView.charge(() => predictNow(at, theta), () => ctx.mesh?.computeIdle?.())).then((pred) => {
    if (g !== at) return;
    at.pred = pred;
    at.step = step;
    render(at);
  }).catch((err) => console.warn(`gallery: ${err.message}`)).finally(() => { at.busy = false; });
}

/** A new run: the grid is built again for its trainer. */
function galleryReset() {
  g = null;
  dispatch("gallery:reset");
  $("gallery").replaceChildren();
  $("gallery-panel").hidden = true;
  $("end-confusion").hidden = true;
}

/** The end of the run: the grid at the last step and the end card's confusion matrix. */
async function galleryDone(step) {
  const at = ensure();
  if (!at) return;
  while (at.busy) await new Promise((r) => setTimeout(r, 50));
  await galleryStep(step, true);
  const tr = at.tr;
  try {
    const m = typeof tr.confusion === "function" ? await tr.confusion("test") : await confusionOf(tr, tr.theta.slice(), "test");
    renderConfusion(tr.ds, m, step);
  } catch (err) {
    console.warn(`confusion matrix: ${err.message}`);
  }
}

function renderConfusion(ds, m, step) {
  const C = m.classes;
  const table = $("confusion");
  const head = document.createElement("tr");
  const corner = cell("th", "");
  corner.innerHTML = '<span class="wide-only">true \\ predicted</span><span class="narrow-only" aria-hidden="true">t\\p</span>';
  corner.title = "a row is the true class, a column the model's answer";
  head.append(corner);
  for (let c = 0; c < C; c++) {
    const th = cell("th", className(ds, c), "col");
    th.title = className(ds, c);
    head.append(th);
  }
  const rows = [head];
  let maxDiag = 1; // shades: the diagonal against its largest count, the errors against theirs
  let maxOff = 1;
  for (let i = 0; i < C * C; i++) {
    if (i % (C + 1) === 0) maxDiag = Math.max(maxDiag, m.counts[i]);
    else maxOff = Math.max(maxOff, m.counts[i]);
  }
  for (let t = 0; t < C; t++) {
    const tr = document.createElement("tr");
    const th = cell("th", className(ds, t), "row");
    th.title = className(ds, t);
    tr.append(th);
    for (let p = 0; p < C; p++) {
      const v = m.counts[t * C + p];
      const td = cell("td", String(v));
      td.dataset.count = String(v);
      td.dataset.true = String(t);
      td.dataset.pred = String(p);
      if (t === p) td.classList.add("diag");
      else if (v) td.classList.add("off");
      td.style.setProperty("--shade", (v / (t === p ? maxDiag : maxOff)).toFixed(3));
      tr.append(td);
    }
    rows.push(tr);
  }
  table.replaceChildren(...rows);
  table.dataset.n = String(m.n);
  table.dataset.correct = String(m.correct);
  $("confusion-summary").textContent = `${F.count(m.correct)} of the ${F.count(m.n)} test images right at step ${step} ` +
    "(the diagonal); a row is a true class, a column the model's answer.";
  $("end-confusion").hidden = false;
}

function cell(tag, text, scope = null) {
  const el = document.createElement(tag);
  el.textContent = text;
  if (scope) el.scope = scope;
  return el;
}

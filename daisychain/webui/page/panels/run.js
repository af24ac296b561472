// The run as it goes: step, loss, live test accuracy, rate and time left, the status bar at
// the top, the counters, the devices that refused it; the tab's title.
// A panel of the page: it subscribes to what it shows, owns its part of the DOM and reads the
// store (store.js).

import * as F from "../ui_format.js";
import { $, ctx, dispatch, state, words } from "./store.js";
import { showError } from "./say.js";
import { accuracyView } from "./eval_budget.js";

export class RunPanel {
  constructor(bus) {
    this.bus = bus;
    bus.on("page:new-run", () => {
      $("end-card").hidden = true;
      renderCounters();
    });
    bus.on("room:peers", () => this.renderSoon());
    bus.on("counters", () => this.countersSoon());
    for (const ev of ["run:preparing", "run:state", "run:restored", "page:run-changed"]) bus.on(ev, () => this.render());
    bus.on("run:step", (s) => {
      this.liveAccuracy(s.step);
      this.renderSoon();
    });
    bus.on("run:done", (s) => {
      if (s.counters) renderCounters();
      this.render();
      bus.emit("page:run-done", s); // the end card comes after the page's phase changed
      sayRunEnded(s);
    });
    bus.on("run:refused", ({ peer }) => {
      const text = state.refusals.at(-1).message;
      const li = document.createElement("li");
      li.textContent = text;
      $("refusals").appendChild(li);
      $("refusals").hidden = false;
      if (peer === state.id) showError("run-error", text);
    });
    // numbers that change with time (step rate, time left) without a new event
    setInterval(() => { if (state.run.state === "running") this.render(); }, 1000);
  }

  render() {
    renderRun();
    this.bus.emit("page:run");
  }

  /** render at the next frame, once however many events ask for it before then; at most
   *  every RENDER_EVERY_MS while steps commit. */
  renderSoon() {
    if (this.queued) return;
    this.queued = true;
    const go = () => { this.queued = false; this.at = performance.now(); this.render(); };
    const wait = Math.max(0, (this.at || 0) + RENDER_EVERY_MS - performance.now());
    setTimeout(() => (document.hidden ? go() : requestAnimationFrame(go)), wait);
  }

  /** renderCounters at most every RENDER_EVERY_MS: the counters change at every step. */
  countersSoon() {
    if (this.countersQueued) return;
    this.countersQueued = true;
    const wait = Math.max(0, (this.countersAt || 0) + RENDER_EVERY_MS - performance.now());
    setTimeout(() => { this.countersQueued = false; this.countersAt = performance.now(); renderCounters(); }, wait);
  }

  /** Test accuracy of the replica now, on a fixed subset, in the compute worker; the
   *  parameters are only read (a copy goes to the worker), so the run's hash is unchanged.
   *  At most every accuracyEvery steps, and after a run's first FREE_VIEWS points within the
   *  live views' budget (eval_budget.js). */
  liveAccuracy(step) {
    const la = state.liveAccuracy;
    const tr = ctx.mesh?.peer?.trainer;
    if (!la || la.busy || !tr || typeof tr.probs !== "function" || step < la.next || !accuracyView.due(la.taken || 0)) return;
    if (Number.isFinite(state.run.steps) && step >= state.run.steps) return; // the end measures the whole set
    dispatch("live-accuracy", { la, busy: true, next: step + accuracyEvery(state.run.steps), taken: (la.taken || 0) + 1 });
    const n = Math.min(LIVE_ACC_SAMPLES, tr.ds.y_test.data.length);
    const theta = tr.theta.slice(); // this step's parameters, whenever the view runs
    accuracyView.charge(() => tr.accuracy("test", n, theta), () => ctx.mesh?.computeIdle?.()).then((acc) => {
      if (state.liveAccuracy !== la) return; // another run began meanwhile
      dispatch("live-accuracy", { la, value: acc, step, n });
      this.bus.emit("page:accuracy", { step, value: acc });
      this.render();
    }).catch((err) => console.warn(`live accuracy: ${err.message}`)).finally(() => dispatch("live-accuracy", { la, busy: false }));
  }
}

/** At most this often the run's numbers are drawn again while steps commit (a step can take
 *  a few milliseconds: drawing the numbers and tables at every one keeps the page busy). */
const RENDER_EVERY_MS = 250;

export function rateAndEta() {
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

/** Write `text` into an element only when it changes (no needless style and layout work). */
function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

function renderRun() {
  const r = state.run;
  const phase = ["starting", "running"].includes(r.state) ? "running"
    : r.state === "done" && !state.editing ? "done" : "setup"; // "Back to settings": the next run's
  if ($("main").dataset.phase !== phase) $("main").dataset.phase = phase;
  $("run-state").textContent = words(r.text || r.state);
  $("step").textContent = String(r.step);
  $("steps-total").textContent = r.steps ?? "—";
  const loc = state.roomPeers?.local; // a local-steps run: a step is a round
  $("local-label").hidden = $("local-steps").hidden = !loc;
  if (loc) setText($("local-steps"), F.localSteps(loc, r.step));
  $("loss").textContent = F.loss(r.loss);
  $("params-sha256").textContent = r.sha || "—";
  $("run-id").textContent = r.runId || "—";
  const la = state.liveAccuracy;
  $("accuracy").textContent = r.state === "done" && Number.isFinite(r.accuracy) ? `${F.percent(r.accuracy)} (the whole test set)`
    : la && Number.isFinite(la.value) ? `${F.percent(la.value)} at step ${la.step} (${F.count(la.n)} test samples)` : "—";
  const { rate, eta } = rateAndEta();
  const live = r.state === "running";
  if (live && Number.isFinite(rate)) dispatch("last-rate", { rate });
  $("step-rate").textContent = live || r.state === "done" ? F.stepRate(live ? rate : state.lastRate) : "—";
  $("eta").textContent = live ? F.duration(eta) : r.state === "done" ? "done" : "—";
  $("preparing").hidden = r.state !== "starting";
  renderRunbar(eta);
  renderPreparing();
}

/** Test samples the live accuracy is measured on (the first ones of the test split). */
export const LIVE_ACC_SAMPLES = 500;

/** Every this many steps the page measures the test accuracy (about 40 points a run). */
export function accuracyEvery(steps) {
  return Math.max(5, Math.ceil((Number(steps) || 0) / 40));
}

export const TITLE = document.title;

/** The bar pinned at the top during a run (step / total, time left, accuracy) and the tab's title. */
function renderRunbar(eta) {
  const r = state.run;
  const live = ["starting", "running"].includes(r.state);
  if ($("runbar").hidden === live) $("runbar").hidden = !live;
  if (!live) return;
  const total = Number.isFinite(r.steps) ? r.steps : null;
  setText($("rb-step"), `${F.count(r.step)} / ${total === null ? "—" : F.count(total)}`);
  const pct = total ? Math.floor((100 * r.step) / Math.max(total, 1)) : null;
  if ($("rb-progress").value !== (pct ?? 0) / 100) $("rb-progress").value = (pct ?? 0) / 100;
  setText($("rb-eta"), r.state === "starting" ? "preparing" : F.duration(eta));
  setText($("rb-acc"), F.percent(state.liveAccuracy?.value));
  const title = pct === null ? TITLE : `${pct}% of ${F.count(total)} steps — DaisyChain`;
  if (document.title !== title) document.title = title; // once a percent
}

/** The end of a run, said where the person is: the tab's title and (if allowed) a notification. */
function sayRunEnded(d) {
  const acc = Number.isFinite(d.accuracy) ? `, test accuracy ${F.percent(d.accuracy)}` : "";
  const stopped = Number.isFinite(state.run.steps) && d.step < state.run.steps;
  const text = `${stopped ? "Stopped" : "Done"} after ${F.count(d.step)} steps${acc}`;
  document.title = `${stopped ? "Stopped" : "Done"}${acc ? `: ${F.percent(d.accuracy)}` : ""} — DaisyChain`;
  dispatch("ended", { text, title: document.title, notified: false });
  if (typeof Notification === "function" && Notification.permission === "granted" && document.hidden) {
    try {
      new Notification("DaisyChain: the run is done", { body: text, tag: "daisychain-run" });
      dispatch("ended:notified");
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
  for (const k of ["multiply", "requantize", "relu", "exp", "micro"]) {
    const el = $(`count-${k}`);
    el.textContent = c && Number.isFinite(c[k]) ? F.count(c[k]) : "—";
    el.dataset.value = c && Number.isFinite(c[k]) ? String(c[k]) : "";
  }
  $("count-exp-row").hidden = !(c && Number.isFinite(c.exp)); // a transformer's softmax only
}

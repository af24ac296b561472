// This device: what it computes on and why, its measured speed.
// A panel of the page (app.js wires the bus to them): it owns its part of the DOM and reads
// the one store (store.js state).

import * as F from "../ui_format.js";
import { $, state } from "./store.js";
import { renderChecklist } from "./room.js";

// -- this device -------------------------------------------------------------------------------

/** A plain-http page on a LAN address is no secure context: say that, not "navigator.gpu is missing". */
export function deviceReason(d) {
  if (window.isSecureContext || d.kind === "webgpu") return d.reason;
  const why = `WebGPU needs a secure context (https, or http on localhost) and this page was opened over plain http on ${location.host}`;
  const replaced = d.reason.replace(/this browser has no WebGPU \(navigator\.gpu is missing\)/, why);
  return replaced === d.reason ? `${why}; ${d.reason}` : replaced;
}

/** The device card's "computes on" line: the path, on the CPU whether WebAssembly SIMD runs
 *  the kernels or the JS units do (cpuNote, next to the reason, says why not SIMD), and on how
 *  many compute workers (device.js workers: the pool's size and why). */
export function computesOn(d) {
  if (d.kind === "webgpu") return "WebGPU (the WGSL unit kernels)";
  const on = d.cpuPath === "wasm" ? "CPU (WebAssembly SIMD kernels)" : "CPU (the JS units)";
  const w = d.workers;
  if (!w) return on;
  if (w.size < 1) return `${on}, on the page's thread (${w.why})`;
  return `${on}, ${w.size} worker${w.size === 1 ? "" : "s"} (${w.why})`;
}

export function renderDevice() {
  const d = state.device;
  if (!d) return;
  $("device-kind").textContent = computesOn(d);
  $("device-reason").textContent = F.plainReason(deviceReason(d)) + (d.cpuNote ? ` (${d.cpuNote})` : "");
  $("device-capacity").textContent = Number.isFinite(d.runCapacity)
    ? `${F.rate(d.runCapacity, d.runMicro)} on the run's model (measured when it started); ${F.rate(d.capacity)} on the self-test's digits probe`
    : `${F.rate(d.capacity)} on the self-test's digits probe; measured again on the run's model when a run starts`;
  renderChecklist();
}

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

export function renderDevice() {
  const d = state.device;
  if (!d) return;
  $("device-kind").textContent = d.kind === "webgpu" ? "WebGPU (the WGSL unit kernels)" : "CPU (the JS units)";
  $("device-reason").textContent = F.plainReason(deviceReason(d));
  $("device-capacity").textContent = Number.isFinite(d.runCapacity)
    ? `${F.rate(d.runCapacity, d.runMicro)} on the run's model (measured when it started); ${F.rate(d.capacity)} on the self-test's digits probe`
    : `${F.rate(d.capacity)} on the self-test's digits probe; measured again on the run's model when a run starts`;
  renderChecklist();
}

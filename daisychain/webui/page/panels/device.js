// This device: what it computes on and why, its measured speed.
// A panel of the page: it subscribes to what it shows, owns its part of the DOM and reads the
// store (store.js); the device's name is its command (ui:rename).

import * as F from "../ui_format.js";
import { $, ctx, dispatch, state } from "./store.js";
import { event } from "./say.js";

export class DevicePanel {
  constructor(bus) {
    this.bus = bus;
    bus.on("run:capacity", ({ capacity }) => { // this device measured on the run's own model
      const micro = ctx.mesh?.peer?.run?.identity?.hyper?.micro_batch ?? state.settingsUsed?.micro_batch ?? 16;
      dispatch("device:run-capacity", { capacity, micro });
      event(`measured on the run's model: ${capacity.toFixed(1)} micro-batches/s (the self-test's digits probe: ${state.device.capacity.toFixed(1)})`);
      this.render();
    });
    $("device-name").onchange = () => {
      const name = $("device-name").value.trim();
      if (!name) return;
      localStorage.setItem("daisychain.name", name);
      dispatch("renamed", { name }); // the rename reconnects: room clicks wait for the server
      bus.emit("ui:rename", { name });
      event(`renamed to ${name}`);
    };
  }

  render() { renderDevice(this.bus); }
}

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

function renderDevice(bus) {
  const d = state.device;
  if (!d) return;
  $("device-kind").textContent = computesOn(d);
  $("device-reason").textContent = F.plainReason(deviceReason(d)) + (d.cpuNote ? ` (${d.cpuNote})` : "");
  $("device-capacity").textContent = Number.isFinite(d.runCapacity)
    ? `${F.rate(d.runCapacity, d.runMicro)} on the run's model (measured when it started); ${F.rate(d.capacity)} on the self-test's digits probe`
    : `${F.rate(d.capacity)} on the self-test's digits probe; measured again on the run's model when a run starts`;
  bus.emit("page:device");
}

// The page (index.html): it builds the shells (network.js, mesh.js) and the panels, and
// starts. Each panel subscribes to the bus events it shows and draws its part of the DOM; the
// store (panels/store.js) changes the state by actions only; the user's clicks are ui:*
// commands that the shells act on (bus.js lists them). The page never touches
// RTCPeerConnection.
//
// Every event a panel renders may never come (an older mesh.js, a peer that left): each part of
// the page falls back to what it can work out from the events it has (bus.js lists them).
//
// window.__daisy exposes the page's state for tests and curious users (read-only use).

import { Mesh, selfTestDevice } from "../shell/mesh.js";
import { Network } from "../shell/network.js";
import { bus } from "../shell/bus.js";
import { roomFromLocation } from "../wire/protocol.js";
import { $, ctx, defaultName, dispatch, running, state } from "./panels/store.js";
import { event, showError, status } from "./panels/say.js";
import { retrying } from "./panels/retry.js";
import { EventsPanel } from "./panels/events.js";
import { DevicePanel, deviceReason } from "./panels/device.js";
import { RoomPanel } from "./panels/room.js";
import { PeersPanel } from "./panels/peers.js";
import { SettingsPanel, loadDatasets } from "./panels/settings.js";
import { ChartPanel } from "./panels/chart_panel.js";
import { ModelDataPanel } from "./panels/model_data.js";
import { RunPanel } from "./panels/run.js";
import { GalleryPanel } from "./panels/gallery.js";
import { EndPanel } from "./panels/end.js";
import { TryPanel } from "./panels/try.js";

// what the page says is shown from the first line on; the chart is there before a run
new EventsPanel(bus);
new ChartPanel(bus);

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
  dispatch("device", { device: { ...device, name } });
  ctx.net = new Network(bus, { name, kind: device.kind, capacity: device.capacity, room });
  ctx.mesh = new Mesh(bus, ctx.net, device);
  dispatch("mesh", { mesh: ctx.mesh }); // its state, for reading
  ctx.tryPanel = new TryPanel($("try-panel"));
  window.__tryPanel = ctx.tryPanel; // for tests (not in window.__daisy: it holds a model)
  // the panels subscribe in this order: what one draws on an event, the next may read
  const devicePanel = new DevicePanel(bus);
  new EndPanel();
  new RoomPanel(bus);
  new PeersPanel(bus);
  new SettingsPanel({ datasets });
  new ModelDataPanel();
  new RunPanel(bus);
  new GalleryPanel();
  devicePanel.render();
  event(`self-test: ${deviceReason(device)}`);
  await ctx.net.start();
  dispatch("ready", { ready: !!state.room });
  bus.emit("page:ready");
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
  dispatch("error", { message: `${err.name}: ${err.message}` });
  status(`This page could not start: ${err.message}`, true);
});

// The room: its code and join link (QR), who asks to join, the three steps, a denied guest.
// A panel of the page: it subscribes to what it shows, owns its part of the DOM and reads the
// store (store.js); creating, joining and approving are its commands (ui:*, network.js).

import * as F from "../ui_format.js";
import { normalizeRoom } from "../../wire/protocol.js";
import { $, dispatch, kindName, nameOf, now, state } from "./store.js";
import { copyText, event, showError, status } from "./say.js";

export class RoomPanel {
  constructor(bus) {
    this.bus = bus;
    this.queued = null; // a room action waiting for the server (a rename reconnects)
    bus.on("net:welcome", () => {
      const queued = this.queued;
      this.queued = null;
      if (queued) setTimeout(queued, 0);
    });
    bus.on("net:room", () => { showError("room-error", ""); this.render(); });
    bus.on("net:pending", () => { showError("room-error", ""); this.render(); });
    bus.on("net:error", ({ code, message }) => {
      if (code === "denied") {
        showError("room-error", `Not let in: ${message}.`);
        status(`Not let in: ${message}.`, true);
        this.render();
      } else if (["no_such_room", "room_full", "too_many_rooms", "too_many_pending"].includes(code)) {
        showError("room-error", message);
        status(message, true);
        this.render();
      }
    });
    for (const ev of ["page:device", "page:run", "page:ready"]) bus.on(ev, () => renderChecklist());
    this.wire();
  }

  render() {
    renderRoom(this.bus);
    this.bus.emit("page:room");
    renderChecklist();
  }

  /** Do a room action now, or (while a rename reconnects to the server) once it is back. */
  roomAction(fn, what) {
    if (state.online !== false) return fn();
    this.queued = fn;
    status(`reconnecting after the rename: ${what} as soon as the server answers`);
  }

  joinFromBox() {
    let code;
    try {
      code = normalizeRoom($("join-code").value);
    } catch (err) {
      showError("room-error", err.message);
      $("join-code").focus();
      return;
    }
    showError("room-error", "");
    this.roomAction(() => {
      this.bus.emit("ui:join", { code });
      history.replaceState(null, "", `?room=${code}`);
    }, `asking to join ${code}`);
  }

  wire() {
    const bus = this.bus;
    $("create-room").onclick = () => {
      showError("room-error", "");
      this.roomAction(() => {
        bus.emit("ui:create-room");
        history.replaceState(null, "", location.pathname);
      }, "creating the private room");
    };
    $("ask-again").onclick = () => {
      const code = state.denied?.code;
      if (!code) return;
      showError("room-error", "");
      this.roomAction(() => bus.emit("ui:join", { code }), `asking to join ${code} again`);
    };
    $("join-room").onclick = () => this.joinFromBox();
    $("join-code").addEventListener("keydown", (e) => {
      if (e.key === "Enter") {
        e.preventDefault();
        this.joinFromBox();
      }
    });
    $("network-room").onclick = () => {
      showError("room-error", "");
      this.roomAction(() => {
        bus.emit("ui:join", { code: "network" });
        history.replaceState(null, "", location.pathname);
      }, "joining the network room");
    };
    $("copy-link").onclick = async () => {
      if (await copyText($("room-link").href, "copy-feedback")) {
        dispatch("share:copied");
        renderChecklist();
      }
    };
    $("share-link").onclick = () => {
      navigator.share?.({ title: "Train with me on DaisyChain", text: `Room ${state.room?.code}`, url: $("room-link").href })
        .then(() => { dispatch("share:copied"); renderChecklist(); })
        .catch(() => {});
    };
    $("share-choice").onchange = (e) => {
      dispatch("share:chosen", { chosen: Number(e.target.value) || 0 });
      renderShare();
    };
  }
}

// -- the room and sharing it ------------------------------------------------------------------

export function roomLink(code) {
  const url = new URL(location.href);
  url.search = `?room=${code}`;
  url.hash = "";
  return url.toString();
}

export function renderCode(el, code) {
  el.replaceChildren();
  const groups = F.codeGroups(code);
  if (!groups.length || !/-/.test(code)) {
    el.textContent = code || "—";
    return;
  }
  el.setAttribute("aria-label", code.split("").join(" "));
  groups.forEach((g, i) => {
    if (i) {
      const s = document.createElement("span");
      s.className = "sep";
      s.textContent = "-";
      el.appendChild(s);
    }
    const span = document.createElement("span");
    span.className = "group";
    span.textContent = g;
    el.appendChild(span);
  });
}

function renderRoom(bus) {
  const r = state.room;
  const waiting = !!state.pending;
  $("waiting").hidden = !waiting;
  if (waiting) {
    $("waiting-text").textContent = `You asked to join room ${state.pending.code}. ` +
      "The host sees your device and decides; this page continues by itself once you are let in.";
    renderCode($("room-code"), state.pending.code);
    $("room-info").textContent = "Waiting for approval.";
  } else if (state.denied && !r) {
    $("room-info").textContent = "Not let in: the host declined. Ask again, or create a room of your own.";
  } else if (r) {
    const n = r.members.length;
    const hostName = r.isHost ? "you are the host" : `${nameOf(r.host)} is the host`;
    $("room-info").textContent = r.room === "private"
      ? `Private room — ${n} device${n === 1 ? "" : "s"}, ${hostName}.`
      : `Network room: the devices on your network — ${n} here, ${hostName}.`;
    if (r.code) renderCode($("room-code"), r.code);
    else $("room-code").textContent = "network room (no code)";
  }
  $("denied-row").hidden = !(state.denied && !r && !waiting);
  renderAskAgain();
  const code = !waiting && r?.room === "private" ? r.code : null;
  $("share-box").hidden = !code;
  if (code && state.share.code !== code) loadShare(code);
  const host = !!r?.isHost;
  $("approvals-panel").hidden = !(host && r.room === "private");
  renderApprovals(bus);
}

/** "Ask to join again", counting down while the server's cool-down after a refusal lasts. */
function renderAskAgain() {
  const left = state.denied ? Math.ceil(state.denied.until - now()) : 0;
  $("ask-again").disabled = left > 0;
  $("ask-again").textContent = left > 0 ? `Ask to join again (in ${left} s)` : "Ask to join again";
  if (left > 0) {
    clearTimeout(renderAskAgain.timer);
    renderAskAgain.timer = setTimeout(renderAskAgain, 1000);
  }
}

/** The join links other devices can reach (GET /share), the QR code of the chosen one. */
async function loadShare(code) {
  dispatch("share", { links: [{ url: roomLink(code), label: "this page's address", lan: false }], note: "",
    chosen: 0, copied: false, code });
  renderShare();
  try {
    const resp = await fetch(`/share?room=${encodeURIComponent(code)}`, { cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const body = await resp.json();
    if (state.share.code !== code) return;
    dispatch("share:links", { links: body.links, note: body.note });
  } catch (err) {
    console.warn(`share: /share did not answer (${err.message}); the page's own address is the link`);
  }
  renderShare();
}

export function isLoopbackPage() {
  const h = location.hostname.replace(/^\[|\]$/g, "");
  return h === "localhost" || h.endsWith(".localhost") || /^127\./.test(h) || h === "::1";
}

function renderShare() {
  const s = state.share;
  if (!s.code) return;
  const link = s.links[Math.min(s.chosen, s.links.length - 1)];
  const a = $("room-link");
  a.textContent = link.url;
  a.href = link.url;
  const origin = new URL(link.url).origin;
  const src = `/share/qr.svg?room=${encodeURIComponent(s.code)}&origin=${encodeURIComponent(origin)}`;
  if ($("room-qr").getAttribute("src") !== src) $("room-qr").src = src;
  $("room-qr").alt = `QR code of ${link.url}`;
  const sel = $("share-choice");
  $("share-choice-row").hidden = s.links.length < 2;
  sel.replaceChildren(...s.links.map((l, i) => {
    const o = document.createElement("option");
    o.value = String(i);
    o.textContent = `${l.label} — ${new URL(l.url).host}`;
    return o;
  }));
  sel.value = String(s.chosen);
  const notes = [];
  if (isLoopbackPage() && s.links.some((l) => l.lan)) {
    notes.push("You opened this page on localhost, which other devices cannot reach: the link and the QR code use this machine's LAN address.");
  } else if (isLoopbackPage() && !s.note) notes.push("You opened this page on localhost, which other devices cannot reach.");
  if (s.note) notes.push(s.note);
  else if (s.links.some((l) => l.lan)) {
    notes.push("A page opened on a LAN address over plain http trains on its CPU: WebAssembly SIMD, or the JS units without it (browsers keep WebGPU for secure contexts: https or localhost).");
  }
  $("share-note").textContent = notes.join(" ");
  $("share-link").hidden = typeof navigator.share !== "function";
}

function renderApprovals(bus) {
  const ul = $("approvals");
  ul.replaceChildren();
  const list = state.room?.pending || [];
  if (!list.length) {
    const li = document.createElement("li");
    li.className = "hint";
    li.textContent = "Nobody is waiting.";
    ul.appendChild(li);
    return;
  }
  for (const dev of list) {
    const li = document.createElement("li");
    li.dataset.peer = dev.id;
    const label = document.createElement("span");
    label.textContent = `${dev.name} — ${kindName(dev.kind)}, ${F.rate(dev.capacity)}`;
    const yes = document.createElement("button");
    yes.className = "approve";
    yes.type = "button";
    yes.textContent = "Approve";
    yes.setAttribute("aria-label", `Approve ${dev.name}`);
    yes.onclick = () => { bus.emit("ui:approve", { id: dev.id }); event(`you let ${dev.name} in`); };
    const no = document.createElement("button");
    no.className = "deny";
    no.type = "button";
    no.textContent = "Deny";
    no.setAttribute("aria-label", `Deny ${dev.name}`);
    no.onclick = () => { bus.emit("ui:deny", { id: dev.id }); event(`you declined ${dev.name}`); };
    li.append(label, yes, no);
    ul.appendChild(li);
  }
}

// -- the checklist -----------------------------------------------------------------------------

function renderChecklist() {
  const d = state.device;
  const r = state.room;
  const ready = !!d && !!r;
  const shared = !!r && (r.members.length > 1 || (r.room === "private" && state.share.copied));
  const started = ["running", "done"].includes(state.run.state) || state.run.step > 0;
  const set = (id, done, text) => {
    $(id).classList.toggle("done", done);
    $(`${id}-text`).textContent = text;
  };
  const guest = !!r && !r.isHost;
  const waitingWhy = state.pending ? "; waiting for the host to let you in" : state.denied ? "; not let in" : "; connecting…";
  set("check-ready", ready, !d ? "the self-test is running"
    : `computes on ${d.kind === "webgpu" ? "WebGPU" : d.cpuPath === "wasm" ? "WebAssembly SIMD" : "the JS units"}, ${F.rate(d.capacity)}${r ? "" : waitingWhy}`);
  set("check-share", shared || guest, state.pending ? "the host of the room decides whether you join"
    : state.denied ? "the host declined: ask again, or create a room of your own"
    : guest ? `you are in ${nameOf(r.host)}'s room`
    : !r ? "create a private room, then let others scan its code"
    : r.members.length > 1 ? `${r.members.length} devices in the room`
      : r.room === "private" ? "show the QR code or send the link; approve who asks" : "create a private room, or wait for devices on your network");
  set("check-start", started, started ? (state.run.state === "done" ? "the run is done" : "the run is going")
    : r?.isHost ? "pick the data below and press Start training" : "the host starts the run; this page follows by itself");
  const first = [["check-ready", ready], ["check-share", shared || guest], ["check-start", started]].find(([, ok]) => !ok);
  for (const id of ["check-ready", "check-share", "check-start"]) $(id).classList.toggle("now", first?.[0] === id);
}

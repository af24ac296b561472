// The event list, the banner at the top and the status line: what happened, said once.
// A panel of the page: it subscribes to what it shows (the page's say.js events and the
// shells' bus events it puts in words), owns its part of the DOM and reads the store.

import { $, dispatch, kindName, nameOf, running, state, words } from "./store.js";

export class EventsPanel {
  constructor(bus) {
    bus.on("page:event", ({ text, cls }) => this.event(text, cls));
    bus.on("page:announce", ({ text, key }) => this.announce(text, key));
    bus.on("page:status", ({ text, error }) => this.status(text, error));
    bus.on("net:status", ({ state: s, text }) => {
      if (s === "online" && state.run.state !== "idle") return;
      this.status(text, s === "refused" || s === "offline");
    });
    bus.on("net:welcome", ({ resumed }) => this.event(resumed ? "reconnected to the server" : "connected to the server"));
    bus.on("net:room", (room) => {
      const change = state.roomChange;
      if (change.wasPending) this.event(`the host let you into room ${room.code}`);
      if (change.created) {
        this.event(`private room ${room.code} created: show its QR code or send the link so others can ask to join`);
      }
      for (const m of change.left) this.announce(`${m.name} left the room`, `left:${m.id}:${state.run.runId || ""}:${state.run.step}`);
      if (change.hostChanged && running() && state.run.runId) this.handover(room.host, state.run.step);
    });
    bus.on("net:pending", ({ code }) => this.event(`asked to join room ${code}; waiting for the host`));
    bus.on("net:join-request", ({ peer }) => this.event(`${peer.name} (${kindName(peer.kind)}) asks to join`));
    bus.on("net:error", ({ message }) => this.event(`server: ${message}`, "error"));
    bus.on("peer:open", ({ id }) => this.event(`direct link to ${nameOf(id)} is open`));
    bus.on("run:handover", ({ step, host }) => this.handover(host, step));
    bus.on("run:stopped", ({ by, byName, step }) => {
      const who = by === state.id ? "you" : byName || nameOf(by);
      this.announce(`${who} stopped the run at step ${step}`, `stopped:${state.run.runId}`);
    });
    bus.on("room:left", ({ id, name }) => {
      this.announce(`${name || nameOf(id)} left the room`, `left:${id}:${state.run.runId || ""}:${state.run.step}`);
    });
    bus.on("run:state", (s) => {
      if (s.text) this.event(s.text, s.state === "refused" || s.state === "failed" ? "error" : "");
      if (["running", "starting"].includes(s.state)) this.status(s.text || "training");
    });
    bus.on("run:done", (s) => {
      this.status(s.agreed === false ? s.text : `The run is done after ${s.step} steps: params-sha256 ${String(s.sha).slice(0, 16)}…`);
      this.event(s.text || "the run is done");
      // a run that ends before its steps was stopped: said once, by run:stopped when it comes
      const runId = state.run.runId;
      if (Number.isFinite(state.run.steps) && s.step < state.run.steps) {
        setTimeout(() => this.announce(`the run was stopped at step ${s.step} of ${state.run.steps}`, `stopped:${runId}`), 400);
      }
    });
    bus.on("run:refused", ({ peer, name }) => {
      const text = state.refusals.at(-1).message;
      this.announce(peer === state.id ? text : `${name || nameOf(peer)} refused the run: ${text.replace(/^.*? refused the run: /, "")}`,
        `refused:${peer}:${state.run.runId}:${text}`);
    });
    bus.on("run:log", ({ text }) => {
      // "X gets no micro-batch of step N: why" comes at every step: once per device, and again
      // when its reason changes (as daisy-peer's progress.py Repeats)
      const m = /^(.+?) gets no micro-batch of step \d+: (.*)$/.exec(text);
      if (m) {
        if (state.noShare?.[m[1]] === m[2]) return;
        dispatch("no-share", { who: m[1], why: m[2] });
      }
      this.event(text);
    });
  }

  handover(host, step) {
    const key = `host:${host}:${state.run.runId}`;
    if (host === state.id) this.announce(`you are now the host: the run goes on from step ${step}`, key);
    else this.announce(`${nameOf(host)} is now the host: the run goes on from step ${step}`, key);
  }

  event(text, cls = "") {
    text = words(text);
    dispatch("event", { text });
    console.log(`[daisy] ${text}`);
    const li = document.createElement("li");
    const t = document.createElement("time");
    t.textContent = new Date().toLocaleTimeString();
    li.append(t, ` — ${text}`);
    if (cls) li.className = cls;
    const ol = $("events");
    ol.appendChild(li);
    while (ol.children.length > 200) ol.firstChild.remove();
    ol.scrollTop = ol.scrollHeight;
  }

  /** Said to this device in a banner at the top (and in the event list). */
  announce(text, key = text) {
    if (state.announcements.some((a) => a.key === key)) return;
    text = words(text);
    dispatch("announced", { key, text });
    const el = $("announce");
    el.textContent = text;
    el.hidden = false;
    this.event(text, "loud");
  }

  status(text, isError = false) {
    $("status").textContent = words(text);
    $("status").classList.toggle("error", isError);
  }
}

// The event list, the banner at the top and the status line: what happened, said once.
// A panel of the page (app.js wires the bus to them): it owns its part of the DOM and reads
// the one store (store.js state).

import { $, state, words } from "./store.js";

export function event(text, cls = "") {
  text = words(text);
  state.events.push(text);
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
export function announce(text, key = text) {
  if (state.announcements.some((a) => a.key === key)) return;
  text = words(text);
  state.announcements.push({ key, text });
  const el = $("announce");
  el.textContent = text;
  el.hidden = false;
  event(text, "loud");
}

export function status(text, isError = false) {
  $("status").textContent = words(text);
  $("status").classList.toggle("error", isError);
}

export function showError(id, text) {
  const el = $(id);
  el.textContent = text ? words(text) : "";
  el.hidden = !text;
}

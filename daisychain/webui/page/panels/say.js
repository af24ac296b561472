// What the page says, from any panel: a line in the event list, a banner at the top, the
// status line. Each is a bus event (page:event, page:announce, page:status) that the events
// panel shows (events.js); `showError` writes a panel's own error line.

import { $, words } from "./store.js";
import { bus } from "../../shell/bus.js";

export function event(text, cls = "") {
  bus.emit("page:event", { text, cls });
}

/** Said to this device in a banner at the top (and in the event list), once per key. */
export function announce(text, key = text) {
  bus.emit("page:announce", { text, key });
}

export function status(text, isError = false) {
  bus.emit("page:status", { text, error: isError });
}

export function showError(id, text) {
  const el = $(id);
  el.textContent = text ? words(text) : "";
  el.hidden = !text;
}

/** Copy `text` to the clipboard, saying in the element `feedback` whether it worked. */
export async function copyText(text, feedback) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch {
    ok = false;
  }
  $(feedback).textContent = ok ? "Copied" : "Select the text and copy it (this browser did not let the page copy)";
  $(feedback).className = ok ? "ok" : "error";
  clearTimeout(copyText.timers?.[feedback]);
  copyText.timers = { ...(copyText.timers || {}), [feedback]: setTimeout(() => { $(feedback).textContent = ""; }, 4000) };
  return ok;
}

// The page's event bus: the one place where network/mesh code (no DOM) and UI code (no
// RTCPeerConnection) meet. Publishers call `emit(type, detail)`; subscribers `on(type, fn)`.
//
// Events (detail in braces), by who emits them. Fields are only ever added, never renamed.
// Ids are the server's peer ids; every event that names a device carries its room name too.
//
//   network.js
//     net:status {state, text}      net:welcome {id, token, resumed}
//     net:room {room, code, you, host, members: [{id, name, kind, capacity, host}], pending, isHost}
//     net:pending {code}             net:join-request {peer}
//     net:error {code, message, ref, peer?, name?}   (message names devices by name; peer/name
//               when the server's message was about one device)
//     net:closed {code, reason}      net:broadcast {sender, data}
//     peer:open {id}  peer:close {id}  peer:message {id, data}  peer:state {id, state}
//     room:left {id, name}           a member is no longer in the room (by its last known name)
//     links {rows: [{id, name, state, rttMs}]}        about once a second: this tab's own links;
//               state "new" | "connecting" | "open" | "failed" | "closed"; rttMs: the selected
//               candidate pair's currentRoundTripTime * 1000, null when unknown
//     room:links {members: [ids], names: {id: name}, matrix: {a: {b: {state, rttMs}}}, reports}
//               about once a second: every member's links as that member last reported them
//               (links.js; a missing matrix[a][b] is unknown). Every tab shares its own row
//               through the signaling server's `broadcast`, so every tab sees the whole room
//               (rooms of up to 32 members; reports: {id: {runId, step, sha}} each member's
//               params hash after its last step)
//
//   mesh.js
//     device {name, kind, capacity, reason, paths}
//     run:state {state, text, runId, steps, step}
//     run:preparing {stage, done, total, text}      between Start (or joining) and the first
//               step: stage "data" | "model" | "identity" | "announce" | "ready"; done/total
//               count stages
//     run:step {step, loss, sha, shares, done, mine, runId, steps, names}
//     counters {multiply, requantize, relu, micro, step, steps}   with every committed step:
//               cluster-wide unit invocations of the run so far (counters.js, the formula of
//               engine/counters.py): micro = micro-batches committed so far (step * n_micro)
//     room:peers {rows: [{id, name, kind, capacity, share, micro, hashAgrees, you, host, left}],
//               pooledCapacity, stepRate, etaSeconds, step, steps}
//               after each committed step (at most 10 a second, the last one always
//               comes), on membership changes and when a member's hash report changes; rows: the room's members, then (left:
//               true, capacity 0) devices that did work in this run and left; share: this step's
//               fraction of the micro-batches (0..1); micro: micro-batches done in this run;
//               hashAgrees: true/false when the peer's last reported params hash (at a step
//               this tab also holds) is/isn't ours, null when unknown; pooledCapacity: sum of
//               the members' micro-batches/s; stepRate: steps/s over a sliding window (null
//               until two steps); etaSeconds: (steps - step) / stepRate, null when unknown
//     run:done {state, text, step, sha, agreed, accuracy, counters}
//     run:log {text, peer?, name?}      run:error {message, peer?, name?}
//     run:refused {peer, name, reasons, message}
//     run:handover {step, you, host, hostName, text}   the coordinator changed; you: this tab
//     run:stopped {by, byName, step, text}             the host stopped the run early
//     run:restored {step, sha, by, byName, runId, steps}
//
//   page/panels/store.js (the page's reducer: state changes only by dispatched actions)
//     page:new-run {gallery}           a run began here: the panels clear its numbers, the chart
//               and (gallery) the grid
//   page/panels/* (what a panel changed that another one shows; each panel subscribes itself)
//     page:room  page:run  page:device  after the room, run or device panel drew itself
//     page:settings {host, busy}   the settings panel drew itself (who hosts, a run busy)
//     page:event {text, cls}  page:announce {text, key}  page:status {text, error}
//               what the page says (panels/say.js); the events panel shows it
//     page:datasets {select}  page:validate  page:fill-settings {identity, steps}
//     page:accuracy {step, value}      the live test accuracy measured at a step
//     page:run-done {...run:done}      the run panel drew the run's end: the end card follows
//     page:run-changed  page:checkpoint-note {text}  page:datasets-loaded  page:ready
//     page:try {trainer, label}  page:try-row {row}   the model the try panel answers with, a
//               test row to try it on
//     page:load-datasets, page:read-settings   requests (bus.request) the settings panel answers
//
//   the page's panels: ui:* (commands of the user; the shells act on them)
//     network.js   ui:join {code}  ui:create-room  ui:approve {id}  ui:deny {id}  ui:rename {name}
//     mesh.js      ui:stop {reason}; requests: ui:start {settings, resume}  ui:snapshot
//                  ui:restore {state, steps}  ui:load-data {task, fingerprint, name, context}

export class Bus {
  constructor() {
    this._subs = new Map();
    this.trace = null; // optional (type, detail) => void, e.g. console logging
  }

  /** Subscribe; returns an unsubscribe function. `type` "*" receives every event. */
  on(type, fn) {
    if (!this._subs.has(type)) this._subs.set(type, new Set());
    this._subs.get(type).add(fn);
    return () => this._subs.get(type)?.delete(fn);
  }

  once(type, fn) {
    const off = this.on(type, (d, t) => { off(); fn(d, t); });
    return off;
  }

  /** Resolve with the detail of the next `type` event for which `pred(detail)` holds. */
  next(type, pred = () => true) {
    return new Promise((resolve) => {
      const off = this.on(type, (d) => { if (pred(d)) { off(); resolve(d); } });
    });
  }

  /** A command with an answer: the first subscriber that returns something (a value or a
   *  promise) answers; a promise of it, rejected when none does or the handler throws. */
  request(type, detail = {}) {
    if (this.trace) this.trace(type, detail);
    for (const fn of [...(this._subs.get(type) || [])]) {
      try {
        const out = fn(detail, type);
        if (out !== undefined) return Promise.resolve(out);
      } catch (err) {
        return Promise.reject(err);
      }
    }
    return Promise.reject(new Error(`nothing on the page answers ${type}`));
  }

  emit(type, detail = {}) {
    if (this.trace) this.trace(type, detail);
    for (const key of [type, "*"]) {
      for (const fn of [...(this._subs.get(key) || [])]) {
        try {
          fn(detail, type);
        } catch (err) {
          console.error(`bus: a handler of ${type} failed:`, err);
        }
      }
    }
  }
}

export const bus = new Bus();

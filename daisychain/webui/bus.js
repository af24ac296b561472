// The page's event bus: the one place where network/mesh code (no DOM) and UI code (no
// RTCPeerConnection) meet. Publishers call `emit(type, detail)`; subscribers `on(type, fn)`.
//
// Events (detail in braces), by who emits them:
//   network.js  net:status {state, text}      net:welcome {id, token, resumed}
//               net:room {room, code, you, host, members, pending, isHost}
//               net:pending {code}             net:join-request {peer}
//               net:error {code, message, ref} net:closed {code, reason}
//               peer:open {id}  peer:close {id}  peer:message {id, data}  peer:state {id, state}
//   mesh.js     device {name, kind, capacity, reason, paths}
//               run:state {...}  run:step {step, loss, sha, shares}  run:done {...}
//               run:error {message}  run:refused {peer, message}
//   app.js      ui:* (requests from the user; the owners of the state act on them)

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

// The page's network: signaling over /ws (every message built and read by protocol.js) and
// one RTCPeerConnection with one data channel per other member of the room. It never touches
// the DOM; it reports what happens on the bus (bus.js lists the events) and offers methods:
//
//   const net = new Network(bus, { name, kind, capacity, room });
//   await net.start();
//   net.approve(id); net.deny(id); net.createRoom(); net.join(code); net.rename(name);
//   await net.send(peerId, bytes);          // one binary message (<= 256 KiB), flow-controlled
//   net.openPeers();                        // ids with an open data channel
//
// Who offers: of two members, the one whose id sorts first (plain string comparison) creates
// the RTCPeerConnection's data channel and the offer; the other answers and receives the
// channel in `ondatachannel` (docs/MESH.md, "Connections"). A connection that fails is closed
// and made again while both are members.

import * as P from "./protocol.js";

export const CHANNEL_LABEL = "daisychain";
export const MAX_MESSAGE_BYTES = 256 * 1024;
export const HIGH_WATER = 8 * 1024 * 1024;
export const LOW_WATER = 1024 * 1024;

const RECONNECT_MS = [250, 500, 1000, 2000, 4000];

/** One other member: its RTCPeerConnection, its data channel, a queue that respects
 *  bufferedAmount. */
class PeerLink {
  constructor(net, id, polite) {
    this.net = net;
    this.id = id;
    this.offerer = !polite;
    this.pc = new RTCPeerConnection({ iceServers: net.iceServers });
    this.channel = null;
    this.remoteSet = false;
    this.pendingCandidates = [];
    this.closed = false;
    this.waiters = [];
    this.pc.onicecandidate = (ev) => { if (!this.closed) net._signal(P.candidate(id, ev.candidate || null)); };
    this.pc.onconnectionstatechange = () => {
      const state = this.pc.connectionState;
      console.log(`network: link to ${id}: ${state}`);
      net.bus.emit("peer:state", { id, state });
      if (state === "failed") net._relink(id);
    };
    this.pc.ondatachannel = (ev) => this._adopt(ev.channel);
  }

  async offer() {
    this._adopt(this.pc.createDataChannel(CHANNEL_LABEL, { ordered: true }));
    const desc = await this.pc.createOffer();
    await this.pc.setLocalDescription(desc);
    this.net._signal(P.offer(this.id, this.pc.localDescription));
  }

  async onOffer(sdp) {
    await this.pc.setRemoteDescription({ type: "offer", sdp });
    await this._flushCandidates();
    const desc = await this.pc.createAnswer();
    await this.pc.setLocalDescription(desc);
    this.net._signal(P.answer(this.id, this.pc.localDescription));
  }

  async onAnswer(sdp) {
    if (this.pc.signalingState !== "have-local-offer") return;
    await this.pc.setRemoteDescription({ type: "answer", sdp });
    await this._flushCandidates();
  }

  async onCandidate(cand) {
    if (!this.remoteSet) {
      this.pendingCandidates.push(cand);
      return;
    }
    if (cand) await this.pc.addIceCandidate(cand);
  }

  async _flushCandidates() {
    this.remoteSet = true;
    for (const c of this.pendingCandidates.splice(0)) if (c) await this.pc.addIceCandidate(c);
  }

  _adopt(ch) {
    if (this.channel && this.channel !== ch) return;
    this.channel = ch;
    ch.binaryType = "arraybuffer";
    ch.bufferedAmountLowThreshold = LOW_WATER;
    ch.onopen = () => this._opened();
    ch.onclose = () => {
      this._wake();
      if (!this.closed) this.net._relink(this.id);
    };
    ch.onbufferedamountlow = () => this._wake();
    ch.onmessage = (ev) => {
      if (typeof ev.data === "string") {
        console.warn(`network: text message from ${this.id} ignored (frames are binary)`);
        return;
      }
      this.net.bus.emit("peer:message", { id: this.id, data: ev.data });
    };
    if (ch.readyState === "open") this._opened();
  }

  _opened() {
    if (this.announced) return;
    this.announced = true;
    this.net.bus.emit("peer:open", { id: this.id });
  }

  get open() { return !this.closed && this.channel?.readyState === "open"; }

  _wake() { for (const w of this.waiters.splice(0)) w(); }

  /** Send one binary message; waits while the channel holds more than HIGH_WATER bytes. */
  async send(bytes) {
    if (bytes.byteLength > MAX_MESSAGE_BYTES) {
      throw new RangeError(`a data-channel message is limited to ${MAX_MESSAGE_BYTES} bytes, got ${bytes.byteLength}`);
    }
    while (this.open && this.channel.bufferedAmount + bytes.byteLength > HIGH_WATER) {
      await new Promise((resolve) => this.waiters.push(resolve));
    }
    if (!this.open) throw new Error(`the channel to ${this.id} is closed`);
    this.channel.send(bytes);
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    this._wake();
    try { this.channel?.close(); } catch { /* already closed */ }
    try { this.pc.close(); } catch { /* already closed */ }
  }
}

export class Network {
  /**
   * @param {import("./bus.js").Bus} bus
   * @param {{name: string, kind: string, capacity: number, room?: string, base?: string}} device
   *   room: "network", "new" or a private code; base: the server origin (default: this page's)
   */
  constructor(bus, { name, kind, capacity, room = P.ROOM_NETWORK, base = location.origin }) {
    this.bus = bus;
    this.device = { name, kind, capacity };
    this.wantRoom = room;
    this.base = base;
    this.iceServers = [];
    this.id = null;
    this.token = null;
    this.room = null;     // the last room state
    this.pending = null;  // {code} while waiting for approval
    this.links = new Map();
    this.ws = null;
    this.stopped = false;
    this.retries = 0;
    this.denied = false;
    this.debug = new URLSearchParams(location.search).has("debug");
  }

  async start() {
    try {
      const resp = await fetch(new URL("/ice-servers", this.base), { cache: "no-store" });
      if (resp.ok) this.iceServers = (await resp.json()).iceServers || [];
    } catch (err) {
      console.warn(`network: /ice-servers unavailable (${err.message}); using none`);
    }
    this._connect();
  }

  _status(state, text) { this.bus.emit("net:status", { state, text }); }

  _connect() {
    const url = new URL("/ws", this.base);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    this._status("connecting", "connecting to the server…");
    const ws = this.ws = new WebSocket(url);
    ws.onopen = () => {
      this.retries = 0;
      ws.send(P.encode(P.hello({ ...this.device, room: this.wantRoom, token: this.token })));
    };
    ws.onmessage = (ev) => this._receive(ev.data);
    ws.onclose = (ev) => {
      if (ws !== this.ws) return;
      this.bus.emit("net:closed", { code: ev.code, reason: ev.reason });
      if (this.stopped) return;
      const delay = RECONNECT_MS[Math.min(this.retries++, RECONNECT_MS.length - 1)];
      this._status("offline", `lost the server (${ev.reason || `code ${ev.code}`}); reconnecting…`);
      setTimeout(() => { if (!this.stopped) this._connect(); }, delay);
    };
  }

  _signal(msg) {
    if (this.ws?.readyState === WebSocket.OPEN) this.ws.send(P.encode(msg));
  }

  _receive(text) {
    let msg;
    if (this.debug) console.log(`network: <- ${text.slice(0, 200)}`);
    try {
      msg = P.parseServer(text);
    } catch (err) {
      console.error(`network: bad message from the server: ${err.message}`);
      return;
    }
    const handler = this[`_on_${msg.type}`];
    Promise.resolve(handler.call(this, msg)).catch((err) => {
      console.error(`network: handling ${msg.type} failed:`, err);
    });
  }

  // -- server messages -----------------------------------------------------------------------

  _on_welcome(msg) {
    if (!msg.resumed && this.id && msg.id !== this.id && this.openPeers().length) {
      // The server forgot this device (it restarted, or we were away past its grace period)
      // while the direct links are up: a new identity would be a stranger to them, so stay
      // who we are and go on without signaling (no new members, no hand-over).
      const text = "the server restarted and no longer knows this device: the run goes on over " +
        "the direct links, without the server (reload the page to join again)";
      console.warn(`network: ${text}`);
      this.stopped = true;
      this._signal(P.leave());
      try { this.ws.close(1000, "leaving"); } catch { /* gone */ }
      this._status("offline", text);
      this.bus.emit("net:error", { code: "forgotten", message: text, ref: "hello" });
      return;
    }
    this.id = msg.id;
    this.token = msg.token;
    if (msg.iceServers?.length) this.iceServers = [...msg.iceServers];
    this.bus.emit("net:welcome", { id: msg.id, token: msg.token, resumed: msg.resumed });
  }

  _on_room(msg) {
    this.pending = null;
    this.denied = false;
    this.room = msg;
    // From now on a reconnect without a token returns to this room.
    this.wantRoom = msg.room === "private" ? msg.code : P.ROOM_NETWORK;
    const others = new Set(msg.members.map((m) => m.id).filter((id) => id !== msg.you));
    for (const [id, link] of this.links) {
      if (!others.has(id)) {
        link.close();
        this.links.delete(id);
        this.bus.emit("peer:close", { id });
      }
    }
    for (const id of others) if (!this.links.has(id) && this.id < id) this._link(id);
    this._status("online", msg.room === "private" ? `in private room ${msg.code}` : "in the network room");
    this.bus.emit("net:room", { ...msg, isHost: msg.host === msg.you });
  }

  _on_pending(msg) {
    this.pending = { code: msg.code };
    this.room = null;
    this._dropLinks();
    this._status("waiting", `waiting for the host of room ${msg.code} to let you in`);
    this.bus.emit("net:pending", { code: msg.code });
  }

  _on_join_request(msg) { this.bus.emit("net:join-request", { peer: msg.peer }); }

  _on_pong() {}

  _on_error(msg) {
    if (msg.code === P.ErrorCode.DENIED || (msg.code === P.ErrorCode.NO_SUCH_ROOM && msg.ref === "join")
        || (msg.code === P.ErrorCode.NO_SUCH_ROOM && msg.ref === "hello")) {
      this.pending = null;
      this.denied = msg.code === P.ErrorCode.DENIED;
      this.wantRoom = P.ROOM_NETWORK;
      this._status("refused", msg.message);
    }
    this.bus.emit("net:error", { code: msg.code, message: msg.message, ref: msg.ref });
  }

  async _on_offer(msg) {
    let link = this.links.get(msg.sender);
    if (link && link.offerer) { // both offered (should not happen with the id rule): restart
      link.close();
      link = null;
    }
    if (!link) link = this._link(msg.sender, { answer: true });
    await link.onOffer(msg.sdp);
  }

  async _on_answer(msg) { await this.links.get(msg.sender)?.onAnswer(msg.sdp); }

  async _on_candidate(msg) { await this.links.get(msg.sender)?.onCandidate(msg.candidate); }

  _on_broadcast(msg) { this.bus.emit("net:broadcast", { sender: msg.sender, data: msg.data }); }

  // -- links ---------------------------------------------------------------------------------

  _link(id, { answer = false } = {}) {
    const link = new PeerLink(this, id, answer);
    this.links.set(id, link);
    if (!answer) {
      link.offer().catch((err) => console.error(`network: offer to ${id} failed:`, err));
    }
    return link;
  }

  _relink(id) {
    const link = this.links.get(id);
    if (!link || link.closed) return;
    link.close();
    this.links.delete(id);
    this.bus.emit("peer:close", { id });
    const still = this.room?.members.some((m) => m.id === id);
    if (still && this.id < id) setTimeout(() => { if (!this.links.has(id)) this._link(id); }, 500);
  }

  _dropLinks() {
    for (const [id, link] of this.links) {
      link.close();
      this.bus.emit("peer:close", { id });
    }
    this.links.clear();
  }

  // -- what the page asks for ----------------------------------------------------------------

  /** Ids of members whose data channel is open. */
  openPeers() { return [...this.links.values()].filter((l) => l.open).map((l) => l.id); }

  async send(id, bytes) {
    const link = this.links.get(id);
    if (!link) throw new Error(`no connection to ${id}`);
    await link.send(bytes);
  }

  approve(id) { this._signal(P.approve(id)); }

  deny(id) { this._signal(P.deny(id)); }

  createRoom() { this.join(P.ROOM_NEW); }

  join(room) {
    const target = P.normalizeRoom(room);
    this._dropLinks();
    this.wantRoom = target;
    this._signal(P.join(target));
  }

  leave() {
    this._dropLinks();
    this._signal(P.leave());
  }

  /** A new name (or capacity): said again in a hello that resumes this identity. */
  update({ name, capacity } = {}) {
    if (name !== undefined) this.device.name = String(name).slice(0, P.MAX_NAME_CHARS).trim() || this.device.name;
    if (capacity !== undefined) this.device.capacity = capacity;
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.close(1000, "renaming");
  }

  stop() {
    this.stopped = true;
    this._dropLinks();
    try { this.ws?.close(1000, "leaving"); } catch { /* gone */ }
  }
}

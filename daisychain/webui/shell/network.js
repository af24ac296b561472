// The page's network: signaling over /ws (every message built and read by protocol.js) and
// one RTCPeerConnection with one data channel per other member of the room. It never touches
// the DOM; it reports what happens on the bus (bus.js lists the events) and offers methods:
//
//   const net = new Network(bus, { name, kind, capacity, room });
//   await net.start();
//   net.approve(id); net.deny(id); net.createRoom(); net.join(code); net.rename(name);
//   await net.send(peerId, bytes);          // one binary message (<= 256 KiB), flow-controlled
//   net.openPeers();                        // ids with an open data channel
//   net.nameOf(id); net.nameIds(text);      // room names instead of ids
//
// About once a second it reports this tab's own links (`links`), shares them with the room
// through the server's `broadcast` (links.js checks what comes back) and reports the room's
// whole matrix (`room:links`).
//
// Who offers: of two members, the one whose id sorts first (plain string comparison) creates
// the RTCPeerConnection's data channel and the offer; the other answers and receives the
// channel in `ondatachannel` (docs/MESH.md, "Connections"). A connection that fails is closed
// and made again while both are members.

import * as P from "../wire/protocol.js";
import { LinkMatrix, linkState, linksPayload, cleanRtt, LINKS_TYPE } from "../wire/links.js";
import { setCredential } from "./uploads.js";

export const CHANNEL_LABEL = "daisychain";
export const MAX_MESSAGE_BYTES = 256 * 1024;
export const HIGH_WATER = 8 * 1024 * 1024;
export const LOW_WATER = 1024 * 1024;

const RECONNECT_MS = [250, 500, 1000, 2000, 4000];
/** How often this tab reports its links (and shares them with the room). */
export const LINKS_EVERY_MS = 1000;
/** Rooms up to this size share their links (room:links); larger ones do not. */
export const LINKS_SHARED_MEMBERS = 32;
const PEER_ID = /'([0-9a-f]{8})'|\b([0-9a-f]{8})\b/g;

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

  /** The contract's state of this link (links.js linkState). */
  get state() { return this.closed ? "closed" : linkState(this.pc.connectionState, this.open); }

  /** Round-trip time of the selected candidate pair in ms, or null when unknown. */
  async rttMs() {
    if (this.closed || this.pc.connectionState !== "connected") return null;
    let stats;
    try {
      stats = await this.pc.getStats();
    } catch {
      return null;
    }
    let pairId = null;
    stats.forEach((r) => { if (r.type === "transport" && r.selectedCandidatePairId) pairId = r.selectedCandidatePairId; });
    let best = null;
    stats.forEach((r) => {
      if (r.type !== "candidate-pair") return;
      if (pairId ? r.id === pairId : r.nominated && r.state === "succeeded") best = r;
    });
    return best && typeof best.currentRoundTripTime === "number" ? cleanRtt(best.currentRoundTripTime * 1000) : null;
  }

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
    this.names = new Map();       // peer id -> its last known room name (also after it left)
    this.failedLinks = new Map(); // peer id -> "failed" | "closed" until a new link is made
    this.matrix = new LinkMatrix();
    this.report = null;           // {runId, step, sha}: mesh.js's last committed step
    this.linksTimer = null;
    // the user's commands (the page's panels emit them; bus.js lists them)
    bus.on("ui:join", ({ code }) => this.join(code));
    bus.on("ui:create-room", () => this.createRoom());
    bus.on("ui:approve", ({ id }) => this.approve(id));
    bus.on("ui:deny", ({ id }) => this.deny(id));
    bus.on("ui:rename", ({ name }) => this.update({ name }));
  }

  /** The room name of `id` (the id itself when no room message named it). */
  nameOf(id) { return this.names.get(id) || id; }

  /**
   * `text` with every known peer id (bare or in quotes) replaced by the device's name:
   * {text, peer, name} (peer/name of the first id found, absent when none).
   */
  nameIds(text) {
    let peer = null;
    const out = String(text).replace(PEER_ID, (m, q, b) => {
      const id = q || b;
      if (!this.names.has(id)) return m;
      if (peer === null) peer = id;
      return this.names.get(id);
    });
    return peer === null ? { text: out } : { text: out, peer, name: this.names.get(peer) };
  }

  /** mesh.js: this replica's params hash after a committed step, shared with the links. */
  setReport(report) { this.report = report; }

  async start() {
    try {
      const resp = await fetch(new URL("/ice-servers", this.base), { cache: "no-store" });
      if (resp.ok) this.iceServers = (await resp.json()).iceServers || [];
    } catch (err) {
      console.warn(`network: /ice-servers unavailable (${err.message}); using none`);
    }
    this._connect();
    if (!this.linksTimer) {
      this.linksTimer = setInterval(() => {
        this.reportLinks().catch((err) => console.warn(`network: link report failed: ${err.message}`));
      }, LINKS_EVERY_MS);
    }
  }

  /** This tab's own links: [{id, name, state, rttMs}] for every other member of the room. */
  async linkRows() {
    const r = this.room;
    if (!r) return [];
    const others = r.members.map((m) => m.id).filter((id) => id !== r.you);
    return Promise.all(others.map(async (id) => {
      const link = this.links.get(id);
      const state = link ? link.state : this.failedLinks.get(id) || "new";
      const rttMs = link ? await link.rttMs() : null;
      return { id, name: this.nameOf(id), state, rttMs };
    }));
  }

  /** Emit `links` and `room:links`, and share this tab's row with the room (once a second). */
  async reportLinks() {
    const rows = await this.linkRows();
    const r = this.room;
    this.bus.emit("links", { rows });
    if (!r) return;
    const now = performance.now() / 1000;
    const own = Object.fromEntries(rows.map((x) => [x.id, { state: x.state, rttMs: x.rttMs }]));
    this.matrix.setOwn(r.you, own, now);
    // Shared while the room is small enough: n members' reports cost the server n^2 relays a
    // second (a bigger room shows each tab its own links only).
    if (rows.length && r.members.length <= LINKS_SHARED_MEMBERS) this._signal(P.broadcast(linksPayload(own, this.report)));
    const v = this.matrix.view(now);
    this.bus.emit("room:links", { ...v, names: Object.fromEntries(v.members.map((id) => [id, this.nameOf(id)])) });
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
    setCredential(msg.token); // the room credential of uploads and data fetches (uploads.js)
    if (msg.iceServers?.length) this.iceServers = [...msg.iceServers];
    this.bus.emit("net:welcome", { id: msg.id, token: msg.token, resumed: msg.resumed });
  }

  _on_room(msg) {
    this.pending = null;
    this.denied = false;
    const before = this.room && this.room.code === msg.code && this.room.room === msg.room ? this.room.members : [];
    for (const m of msg.members) this.names.set(m.id, m.name);
    for (const d of msg.pending || []) this.names.set(d.id, d.name);
    this.room = msg;
    this.matrix.setMembers(msg.members.map((m) => m.id));
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
    const now = new Set(msg.members.map((m) => m.id));
    for (const m of before) {
      if (!now.has(m.id) && m.id !== msg.you) {
        this.failedLinks.delete(m.id);
        this.bus.emit("room:left", { id: m.id, name: m.name });
      }
    }
  }

  _on_pending(msg) {
    this.pending = { code: msg.code };
    this.room = null;
    this._dropLinks();
    this._status("waiting", `waiting for the host of room ${msg.code} to let you in`);
    this.bus.emit("net:pending", { code: msg.code });
  }

  _on_join_request(msg) {
    if (msg.peer?.id) this.names.set(msg.peer.id, msg.peer.name);
    this.bus.emit("net:join-request", { peer: msg.peer });
  }

  _on_pong() {}

  _on_error(msg) {
    if (msg.code === P.ErrorCode.DENIED || (msg.code === P.ErrorCode.NO_SUCH_ROOM && msg.ref === "join")
        || (msg.code === P.ErrorCode.NO_SUCH_ROOM && msg.ref === "hello")) {
      this.pending = null;
      this.denied = msg.code === P.ErrorCode.DENIED;
      this.wantRoom = P.ROOM_NETWORK;
      this._status("refused", msg.message);
    }
    const n = this.nameIds(msg.message); // "'f2d3640e' is no other connected member" -> the name
    this.bus.emit("net:error", { code: msg.code, message: n.text, ref: msg.ref,
      ...(n.peer ? { peer: n.peer, name: n.name } : {}) });
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

  _on_broadcast(msg) {
    if (msg.data && msg.data.type === LINKS_TYPE) {
      if (!this.matrix.receive(msg.sender, msg.data, performance.now() / 1000)) {
        console.warn(`network: a links report from ${this.nameOf(msg.sender)} was not valid: dropped`);
      }
      return;
    }
    this.bus.emit("net:broadcast", { sender: msg.sender, data: msg.data });
  }

  // -- links ---------------------------------------------------------------------------------

  _link(id, { answer = false } = {}) {
    this.failedLinks.delete(id);
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
    this.failedLinks.set(id, link.pc.connectionState === "failed" ? "failed" : "closed");
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
    clearInterval(this.linksTimer);
    this.linksTimer = null;
    this._dropLinks();
    try { this.ws?.close(1000, "leaving"); } catch { /* gone */ }
  }
}

// The signaling wire format, JS mirror of daisychain/signaling.py (ES module, no DOM).
//
// Nothing else in the page knows a JSON field name of /ws: build what you send with the
// functions below (hello, join, offer, ...) and `encode` it; read what arrives with
// `parseServer`, which returns a frozen, validated object or throws ProtocolError.
// Relayed messages arrive with `sender` (wire "from"), stamped by the server.
// Documented message by message in docs/PROTOCOL.md.

export const PROTOCOL_VERSION = 1;

export const MAX_NAME_CHARS = 64;
export const MAX_SDP_CHARS = 32 * 1024;
export const MAX_CANDIDATE_CHARS = 1024;
export const MAX_BROADCAST_BYTES = 16 * 1024;
export const MAX_BROADCAST_DEPTH = 16;
export const MAX_TOKEN_CHARS = 128;
export const MAX_CAPACITY = 1e9;
export const DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024;

export const DEVICE_KINDS = Object.freeze(["webgpu", "cpu", "python"]);
export const ROOM_NETWORK = "network";
export const ROOM_NEW = "new";
export const CODE_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
export const CODE_CHARS = 10;

export const ErrorCode = Object.freeze({
  BAD_JSON: "bad_json",
  BAD_MESSAGE: "bad_message",
  UNKNOWN_TYPE: "unknown_type",
  TOO_LARGE: "too_large",
  VERSION: "version",
  HELLO_FIRST: "hello_first",
  RATE_LIMITED: "rate_limited",
  NOT_IN_ROOM: "not_in_room",
  NOT_APPROVED: "not_approved",
  NOT_HOST: "not_host",
  NO_SUCH_PEER: "no_such_peer",
  NO_SUCH_ROOM: "no_such_room",
  ROOM_FULL: "room_full",
  TOO_MANY_ROOMS: "too_many_rooms",
  TOO_MANY_PENDING: "too_many_pending",
  DENIED: "denied",
  REPLACED: "replaced",
  IDLE: "idle",
  SHUTTING_DOWN: "shutting_down",
  INTERNAL: "internal",
});

/** Input that breaks the protocol: `code` is an ErrorCode value, `message` is for humans. */
export class ProtocolError extends Error {
  constructor(code, message, ref = null) {
    super(message);
    this.name = "ProtocolError";
    this.code = code;
    this.ref = ref;
  }
}

const ID_RE = /^[A-Za-z0-9_-]{1,32}$/;
const utf8 = new TextEncoder();

// -- room codes --------------------------------------------------------------------------------

/** "network", "new" or the canonical code "XXXX-XXXX-XX"; throws on anything else.
 *  Forgives case, dashes, spaces and the look-alikes I/L (1) and O (0). */
export function normalizeRoom(value) {
  if (typeof value !== "string") {
    throw new ProtocolError(ErrorCode.BAD_MESSAGE, "room must be a string");
  }
  const low = value.trim().toLowerCase();
  if (low === ROOM_NETWORK || low === ROOM_NEW) return low;
  const raw = value.replace(/[\s-]/g, "").toUpperCase()
    .replace(/[IL]/g, "1").replace(/O/g, "0");
  if (raw.length !== CODE_CHARS || [...raw].some((c) => !CODE_ALPHABET.includes(c))) {
    throw new ProtocolError(ErrorCode.BAD_MESSAGE,
      `room must be 'network', 'new' or a ${CODE_CHARS}-character code like K7QM-4XZP-9R, ` +
      `not ${JSON.stringify(value.slice(0, 40))}`);
  }
  return `${raw.slice(0, 4)}-${raw.slice(4, 8)}-${raw.slice(8)}`;
}

/** The room a page asks for from its URL: `?room=CODE` is a private room, else the network room. */
export function roomFromLocation(search) {
  const code = new URLSearchParams(search).get("room");
  return code ? normalizeRoom(code) : ROOM_NETWORK;
}

// -- field checks ------------------------------------------------------------------------------

class Fields {
  constructor(obj, type) { this.obj = obj; this.type = type; }

  fail(msg) { return new ProtocolError(ErrorCode.BAD_MESSAGE, `${this.type}: ${msg}`, this.type); }

  has(key) { return this.obj[key] !== undefined && this.obj[key] !== null; }

  str(key, maxChars, { optional = false, pattern = null } = {}) {
    const v = this.obj[key];
    if ((v === undefined || v === null) && optional) return null;
    if (typeof v !== "string") throw this.fail(`'${key}' must be a string`);
    if (v.length > maxChars) throw this.fail(`'${key}' is longer than ${maxChars} characters`);
    if (pattern && !pattern.test(v)) throw this.fail(`'${key}' is not a valid id`);
    return v;
  }

  id(key) { return this.str(key, 32, { pattern: ID_RE }); }

  number(key, lo, hi, { optional = false } = {}) {
    const v = this.obj[key];
    if ((v === undefined || v === null) && optional) return null;
    if (typeof v !== "number" || !Number.isFinite(v)) throw this.fail(`'${key}' must be a finite number`);
    if (v < lo || v > hi) throw this.fail(`'${key}' must be between ${lo} and ${hi}`);
    return v;
  }

  int(key, lo, hi) {
    const v = this.obj[key];
    if (!Number.isInteger(v) || v < lo || v > hi) {
      throw this.fail(`'${key}' must be an integer between ${lo} and ${hi}`);
    }
    return v;
  }

  bool(key) {
    const v = this.obj[key] ?? false;
    if (typeof v !== "boolean") throw this.fail(`'${key}' must be true or false`);
    return v;
  }

  list(key, maxLen) {
    const v = this.obj[key] ?? [];
    if (!Array.isArray(v) || v.length > maxLen) throw this.fail(`'${key}' must be a list of at most ${maxLen} items`);
    return v;
  }

  dict(key) {
    const v = this.obj[key] ?? {};
    if (typeof v !== "object" || Array.isArray(v)) throw this.fail(`'${key}' must be an object`);
    return v;
  }

  room(key) {
    const v = this.str(key, 40, { optional: true });
    return v === null ? ROOM_NETWORK : normalizeRoom(v);
  }
}

function depth(v, limit) {
  if (limit < 0) return 1;
  if (v !== null && typeof v === "object") {
    let d = 0;
    for (const x of Object.values(v)) d = Math.max(d, depth(x, limit - 1));
    return 1 + d;
  }
  return 0;
}

function candidateField(f) {
  const c = f.obj.candidate;
  if (c === null || c === undefined) return null;
  if (typeof c !== "object" || Array.isArray(c)) throw f.fail("'candidate' must be an RTCIceCandidateInit object or null");
  const g = new Fields(c, `${f.type}.candidate`);
  const out = { candidate: g.str("candidate", MAX_CANDIDATE_CHARS) };
  const mid = g.str("sdpMid", 64, { optional: true });
  if (mid !== null) out.sdpMid = mid;
  if (c.sdpMLineIndex !== undefined && c.sdpMLineIndex !== null) out.sdpMLineIndex = g.int("sdpMLineIndex", 0, 65535);
  const frag = g.str("usernameFragment", 256, { optional: true });
  if (frag !== null) out.usernameFragment = frag;
  return out;
}

function broadcastData(f) {
  if (!("data" in f.obj)) throw f.fail("'data' is missing");
  const data = f.obj.data;
  if (depth(data, MAX_BROADCAST_DEPTH) > MAX_BROADCAST_DEPTH) {
    throw f.fail(`'data' is nested deeper than ${MAX_BROADCAST_DEPTH} levels`);
  }
  if (JSON.stringify(data).length > MAX_BROADCAST_BYTES) {
    throw new ProtocolError(ErrorCode.TOO_LARGE, `broadcast: 'data' is over ${MAX_BROADCAST_BYTES} bytes`, f.type);
  }
  return data;
}

function deviceFields(f) {
  const kind = f.str("kind", 16);
  if (!DEVICE_KINDS.includes(kind)) throw f.fail(`'kind' must be one of ${DEVICE_KINDS.join(", ")}`);
  const name = f.str("name", MAX_NAME_CHARS).trim();
  // eslint-disable-next-line no-control-regex
  if (!name || /[\x00-\x1f]/.test(name)) throw f.fail("'name' must be a non-empty line of text");
  return { name, kind, capacity: f.number("capacity", 0, MAX_CAPACITY) };
}

function device(obj, where) {
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) {
    throw new ProtocolError(ErrorCode.BAD_MESSAGE, `${where}: a device must be an object`);
  }
  const f = new Fields(obj, where);
  return Object.freeze({ id: f.id("id"), ...deviceFields(f) });
}

// -- parsers -----------------------------------------------------------------------------------

const CLIENT = {
  hello(f) {
    if (f.obj.version !== PROTOCOL_VERSION) {
      throw new ProtocolError(ErrorCode.VERSION,
        `this side speaks signaling protocol version ${PROTOCOL_VERSION}, got ${JSON.stringify(f.obj.version)}`, "hello");
    }
    return { ...deviceFields(f), room: f.room("room"), token: f.str("token", MAX_TOKEN_CHARS, { optional: true }),
      version: PROTOCOL_VERSION };
  },
  join: (f) => ({ room: f.room("room") }),
  leave: () => ({}),
  approve: (f) => ({ peer: f.id("peer") }),
  deny: (f) => ({ peer: f.id("peer") }),
  ping: (f) => ({ t: f.number("t", -1e300, 1e300, { optional: true }) }),
  offer: (f) => ({ sdp: f.str("sdp", MAX_SDP_CHARS), to: f.id("to") }),
  answer: (f) => ({ sdp: f.str("sdp", MAX_SDP_CHARS), to: f.id("to") }),
  candidate: (f) => ({ candidate: candidateField(f), to: f.id("to") }),
  broadcast: (f) => ({ data: broadcastData(f), to: f.has("to") ? f.id("to") : null }),
};

const member = (obj) => {
  const d = device(obj, "room.members");
  return Object.freeze({ ...d, host: new Fields(obj, "room.members").bool("host") });
};

const SERVER = {
  welcome: (f) => ({
    id: f.id("id"), token: f.str("token", MAX_TOKEN_CHARS), resumed: f.bool("resumed"),
    version: f.int("version", 0, 2 ** 30), iceServers: Object.freeze(f.list("ice_servers", 64)),
    limits: Object.freeze({ ...f.dict("limits") }),
  }),
  room(f) {
    const room = f.str("room", 16);
    if (room !== "network" && room !== "private") throw f.fail("'room' must be 'network' or 'private'");
    return {
      room, code: f.str("code", 16, { optional: true }), you: f.id("you"),
      host: f.has("host") ? f.id("host") : null,
      members: Object.freeze(f.list("members", 10000).map(member)),
      pending: Object.freeze(f.list("pending", 10000).map((d) => device(d, "room.pending"))),
      approved: f.bool("approved"),
    };
  },
  pending: (f) => ({ code: f.str("code", 16) }),
  join_request: (f) => ({ peer: device(f.obj.peer, "join_request.peer") }),
  pong: (f) => ({ t: f.number("t", -1e300, 1e300, { optional: true }) }),
  error: (f) => ({ code: f.str("code", 64), message: f.str("message", 4096), ref: f.str("ref", 64, { optional: true }) }),
  offer: (f) => ({ sdp: f.str("sdp", MAX_SDP_CHARS), sender: f.id("from") }),
  answer: (f) => ({ sdp: f.str("sdp", MAX_SDP_CHARS), sender: f.id("from") }),
  candidate: (f) => ({ candidate: candidateField(f), sender: f.id("from") }),
  broadcast: (f) => ({ data: broadcastData(f), sender: f.id("from") }),
};

function decode(text, maxBytes) {
  if (typeof text !== "string") {
    throw new ProtocolError(ErrorCode.BAD_MESSAGE, "binary frames are not part of the signaling protocol: send JSON text");
  }
  if (text.length > maxBytes || utf8.encode(text).length > maxBytes) {
    throw new ProtocolError(ErrorCode.TOO_LARGE, `message is over ${maxBytes} bytes`);
  }
  let obj;
  try {
    obj = JSON.parse(text);
  } catch (exc) {
    throw new ProtocolError(ErrorCode.BAD_JSON, `message is not valid JSON (${String(exc.message).slice(0, 200)})`);
  }
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) {
    throw new ProtocolError(ErrorCode.BAD_JSON, "message must be a JSON object with a 'type'");
  }
  if (typeof obj.type !== "string") throw new ProtocolError(ErrorCode.BAD_MESSAGE, "message has no string 'type'");
  return obj;
}

function parse(table, text, maxBytes, side) {
  const obj = decode(text, maxBytes);
  if (!Object.prototype.hasOwnProperty.call(table, obj.type)) {
    throw new ProtocolError(ErrorCode.UNKNOWN_TYPE,
      `unknown message type ${JSON.stringify(obj.type.slice(0, 40))}; a ${side} sends: ${Object.keys(table).sort().join(", ")}`);
  }
  return Object.freeze({ type: obj.type, ...table[obj.type](new Fields(obj, obj.type)) });
}

/** A message from the server: a frozen object `{type, ...}`; throws ProtocolError. */
export function parseServer(text, maxBytes = 1 << 24) { return parse(SERVER, text, maxBytes, "server"); }

/** A message as the server would read it (a claimed "from" is dropped). */
export function parseClient(text, maxBytes = DEFAULT_MAX_MESSAGE_BYTES) { return parse(CLIENT, text, maxBytes, "device"); }

// -- building what a device sends ------------------------------------------------------------

function checked(obj) {
  // validate by the same rules the server applies, so mistakes show up here, not as an error reply
  const text = JSON.stringify(obj);
  parseClient(text);
  return Object.freeze(obj);
}

export const hello = ({ name, kind, capacity, room = ROOM_NETWORK, token = null }) =>
  checked({ type: "hello", version: PROTOCOL_VERSION, name, kind, capacity, room, ...(token ? { token } : {}) });
export const join = (room) => checked({ type: "join", room });
export const leave = () => checked({ type: "leave" });
export const approve = (peer) => checked({ type: "approve", peer });
export const deny = (peer) => checked({ type: "deny", peer });
export const ping = (t = null) => checked(t === null ? { type: "ping" } : { type: "ping", t });
/** `description` is an RTCSessionDescription(Init) or its sdp string. */
export const offer = (to, description) => checked({ type: "offer", to, sdp: sdpOf(description) });
export const answer = (to, description) => checked({ type: "answer", to, sdp: sdpOf(description) });
/** `cand` is an RTCIceCandidate(Init), or null for end-of-candidates. */
export const candidate = (to, cand) => checked({ type: "candidate", to, candidate: candidateInit(cand) });
/** To every approved member of the room, or to the one member `to`. */
export const broadcast = (data, to = null) => checked(to === null ? { type: "broadcast", data } : { type: "broadcast", data, to });

function sdpOf(d) { return typeof d === "string" ? d : d?.sdp; }

function candidateInit(c) {
  if (c === null || c === undefined) return null;
  const init = typeof c.toJSON === "function" ? c.toJSON() : c;
  const out = { candidate: init.candidate };
  if (init.sdpMid !== undefined && init.sdpMid !== null) out.sdpMid = init.sdpMid;
  if (init.sdpMLineIndex !== undefined && init.sdpMLineIndex !== null) out.sdpMLineIndex = init.sdpMLineIndex;
  if (init.usernameFragment) out.usernameFragment = init.usernameFragment;
  return out;
}

/** The text frame of a message built above. */
export function encode(msg) { return JSON.stringify(msg); }

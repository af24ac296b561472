// The thin driver (daisychain/peer/run/driver.py): one replica's view of a run, as a plain object:
// no sockets, no timers, no DOM. It holds what every role shares (the settings, the room, the
// clock) and two role objects: always a Member (member.js: the replica, its trainer and the run
// it follows) and, while this tab is the room's host, a Coordinator (coordinator.js, holding
// a Trust: trust.js) built from that member's state. Hand-over is building one;
// stepping down is dropping it (the member takes over its term). Each input goes to the role
// that handles it. The roles read the driver through a read-only RunContext (context.js); what
// they change of it comes back as setting outputs that the driver applies (_applied) before it
// returns the rest. A port of daisychain/peer/run/, rule for rule, so that a tab and
// daisy-peers follow the same run protocol (docs/MESH.md). The shell (mesh.js) feeds it
//   members(ids, host), channelOpen(id), channelClosed(id), receive(sender, msg),
//   computed(step, task, result), data(dataset|null), tick(now)
// and performs what they return: arrays of outputs, each built by its constructor in outputs.js
// (generated from the protocol table, daisychain/peer/run_protocol.json): send, compute, fetch,
// committed, refused, log, ended, removed, joined, restored, alarm (mismatch|refused|removed), dataBytes.
// Messages are plain objects with `T` = run | ready | refuse | assign | sync | data_request |
// restore | end | contrib | total | state | data and the fields of frames.py's dataclasses.
// tests/run/test_scenarios.py plays the same scenario files (tests/scenarios/*.json) against this
// and daisychain/peer/run/ and asserts the same outputs, message for message.
//
// Hashes are async in the browser (crypto.subtle), so every entry point is async; the shell
// calls them one at a time.

import { RunContext, SETTINGS } from "./context.js";
import { Coordinator } from "./coordinator.js";
import { Member } from "./member.js";
import { AGGREGATES } from "./ring.js";
import { CONSTANTS, dispatch } from "./protocol_table.js";
import { log } from "./util.js";

/** Default share of micro-batches spot-checked by a second peer, and mismatches tolerated
 * (the protocol table's constants, peer/run_protocol.json). */
export const VERIFY_RATE = CONSTANTS.VERIFY_RATE;
export const STRIKES = CONSTANTS.STRIKES;
export const MAX_STRIKES = CONSTANTS.MAX_STRIKES;

function randomKey() {
  const b = new Uint8Array(16);
  globalThis.crypto.getRandomValues(b);
  return [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
}

/** The messages each role handles (others are dropped: a coordinator takes no assign, a
 * member no contribution), each by its handler's name (driver.py MEMBER_MESSAGES). */
// driver.py REFUSAL_LINES: refusals of a sender's bad messages that are logged (and struck).
export const REFUSAL_LINES = CONSTANTS.REFUSAL_LINES;

// wire name -> handler, from the protocol table (protocol_table.js dispatch)
const MEMBER_MESSAGES = dispatch("member");
const COORDINATOR_MESSAGES = dispatch("coordinator");
/** The ring's messages (ring_roles.js), handled by the role's `ring`: a chunk by whichever
 * role speaks for the replica, a plan and a commit by a member, a sum by the coordinator. */
const MEMBER_RING_MESSAGES = dispatch("member_ring");
const COORDINATOR_RING_MESSAGES = dispatch("coordinator_ring");

export class RunPeer {
  constructor(me, { kind = "cpu", capacity = null, makeTrainer = null, selftest = [true, "ok"],
    verifyRate = VERIFY_RATE, strikes = STRIKES, verifyKey = null, waitPeers = 0, window = null, aggregate = "star" } = {}) {
    if (!(Number.isFinite(verifyRate) && verifyRate >= 0 && verifyRate <= 1)) throw new RangeError("the verify rate must be in [0, 1]");
    if (!AGGREGATES.includes(aggregate)) throw new RangeError(`the aggregation must be one of ${AGGREGATES.join(", ")}`);
    if (aggregate === "ring" && verifyRate > 0) {
      throw new RangeError("--aggregate ring needs --verify-rate 0: a ring hides each contribution from the spot-checks");
    }
    this.aggregate = aggregate; // auto | star | ring: how a coordinator sums (ring.js)
    if (!(Number.isInteger(strikes) && strikes >= 1 && strikes <= MAX_STRIKES)) throw new RangeError(`strikes must be in [1, ${MAX_STRIKES}]`);
    this.me = me;
    this.kind = kind;
    this.capacity = capacity;
    this.makeTrainer = makeTrainer; // async (identity, dataset) -> Trainer
    this.selftest = selftest;
    this.verifyRate = verifyRate;   // the run's (a member takes its announce's)
    this.strikes = strikes;
    this.verifyKey = verifyKey || randomKey();
    this.windowSize = window; // the rollback window in steps (null: from the verify rate)
    this.waitPeers = waitPeers; // the host waits once for this many members
    this.names = new Map();    // signaling id -> the name it gave (for logs)
    this.steps = 0;       // the run's length (the announce's, or ours as host)
    this.now = 0;
    this.host = null;     // the room host per the signaling server
    this.prevHost = null; // the host it named before (driver.py prev_host)
    this.open = new Set();
    this.room = new Set();
    this.refusals = new Map(); // peer -> bad messages refused
    this.doneBy = {};     // peer -> micro-batches committed (everyone tracks)
    this.context = new RunContext(this); // what the roles read of this driver
    this.member = new Member(this.context);
    this.coordinator = null; // while this tab is the room's host
  }

  // -- what callers read ---------------------------------------------------------------------

  get coordinating() { return this.coordinator !== null; }

  /** The role that speaks for this replica now: the coordinator, else the member. */
  get role() { return this.coordinator ?? this.member; }

  get trainer() { return this.member.trainer; }

  get bounds() { return this.member.bounds; }

  get identity() { return this.member.identity; }

  get sha() { return this.member.sha; }

  get step() { return this.member.step; }

  get term() { return this.role.term; }

  /** The announce: our own while coordinating, else the one the member follows. */
  get run() { return this.role.run; }

  get runId() { return this.run ? this.run.run_id : ""; }

  get ended() { return this.role.ended; }

  get refused() { return this.member.refused; }

  get coord() { return this.coordinator ? this.me : this.member.coord; }

  _name(peer) {
    const name = this.names.get(peer);
    return name && name !== peer ? `${name} (${peer})` : peer;
  }

  /** The roles' outputs of one input: their settings applied here (and dropped), the
   * micro-batches of each committed output counted; the rest goes to the shell. */
  _applied(out) {
    const rest = [];
    for (const o of out) {
      if (o.kind === "setting") {
        if (!SETTINGS.includes(o.name)) throw new Error(`a role may not set the driver's ${o.name}`);
        this[o.name] = o.value;
        continue;
      }
      if (o.kind === "committed") for (const [peer, n] of o.contributors) this.doneBy[peer] = (this.doneBy[peer] || 0) + n;
      rest.push(o);
    }
    return rest;
  }

  // -- hand-over -----------------------------------------------------------------------------

  /** This tab became the room's host: a coordinator from the member's state (it takes over
   * the wait for members: the driver's ends). */
  async _lead() {
    this.coordinator = new Coordinator(this.context, this.member);
    this.waitPeers = 0;
    return this.coordinator.begin();
  }

  /** Another host was named (we were away): drop the coordinator, follow that host. */
  _stepDown(host) {
    this.member.followAfter(this.coordinator);
    this.coordinator = null;
    return [log(`${host} is the coordinator now`)];
  }

  /** This tab hosts a new run (the user pressed Start): a new term and coordinator, announced
   * to every open member, also when this tab already coordinates (a second run after the
   * first ended or was stopped: without the announce the members still follow the old run
   * and drop every assign of the new one). */
  async hostRun(trainer, identity, runId, steps, now) {
    this.now = now;
    if (this.coordinator) this._stepDown(this.me);
    this.steps = steps;
    this.doneBy = {};
    await this.member.host(trainer, identity, runId);
    if (this.host === null) this.host = this.me;
    const out = await this._lead();
    return this._applied([...out, ...this.coordinator.start()]);
  }

  /** The coordinator restores the whole room (coordinator.js restore); throws when this tab
   * does not coordinate or the state does not fit the run. */
  async restore(st, now, steps = null) {
    if (!this.coordinator || !this.trainer) throw new Error("only the coordinator (the room's host) restores the room");
    this.now = now;
    return this._applied(await this.coordinator.restore(st, steps));
  }

  /** End the run after the step in flight (the host's Stop). */
  async stop(why) {
    return this.coordinator ? this._applied(await this.coordinator.stop(why)) : [];
  }

  // -- inputs --------------------------------------------------------------------------------

  async tick(now) {
    this.now = now;
    return this._applied(await (this.coordinator ? this.coordinator.tick() : this.member.tick()));
  }

  /** The signaling room changed: approved online members `ids` (self included); `names`:
   * id -> the name each gave the server (used in logs). */
  async setMembers(ids, host, names = null) {
    const out = [];
    this.room = new Set(ids);
    if (names) for (const [k, v] of Object.entries(names)) this.names.set(String(k), String(v).slice(0, 64));
    if (host !== this.host) this.prevHost = this.host; // who hands over to the next (member.js onRun)
    this.host = host;
    if (host === this.me && !this.coordinator && this.trainer && this.member.run) {
      out.push(...(await this._lead()));
    } else if (host !== this.me && this.coordinator) {
      out.push(...this._stepDown(host));
    }
    if (this.coordinator) return this._applied([...out, ...(await this.coordinator.roomLeft())]);
    const named = this._applied([...out, ...(await this.member.hostNamed())]);
    return [...named, ...this._applied(this.member.aggregation.peersChanged())];
  }

  async channelOpen(peer) {
    this.open.add(peer);
    return this.coordinator ? this._applied(this.coordinator.channelOpen(peer)) : [];
  }

  async channelClosed(peer) {
    this.open.delete(peer);
    return this._applied(this.coordinator ? await this.coordinator._memberLeft(peer) : this.member.aggregation.peersChanged());
  }

  /** A decoded message; `runId` is its frame header's. Messages of another run than the one
   * this peer follows are dropped (loudly); only a peer whose run ended takes a `run`
   * announce of a new one (as daisychain/peer/run/). Each message goes to the role that
   * handles it. */
  async receive(sender, msg, runId = "") {
    if (runId && this.runId && runId !== this.runId && !(msg.T === "run" && this.ended && !this.coordinator)) {
      return [log(`a ${msg.T} message of run ${runId} from ${this._name(sender)}; this peer follows run ${this.runId}: dropped`, true)];
    }
    if (msg.T === "data_request") return this._applied(await this.member.onDataRequest(sender, msg)); // either role serves its dataset
    const ringTable = this.coordinator ? COORDINATOR_RING_MESSAGES : MEMBER_RING_MESSAGES;
    if (Object.hasOwn(ringTable, msg.T)) return this._applied(await this.role.aggregation.onMessage(sender, msg));
    if (msg.T === "ring_plan" || msg.T === "ring_sum" || msg.T === "ring_commit") return [];
    const known = Object.hasOwn(MEMBER_MESSAGES, msg.T) || Object.hasOwn(COORDINATOR_MESSAGES, msg.T);
    if (!known) return [log(`ignored a ${msg.T} message from ${sender}`)];
    const table = this.coordinator ? COORDINATOR_MESSAGES : MEMBER_MESSAGES;
    if (!Object.hasOwn(table, msg.T)) return [];
    const out = this._applied(await this.role[table[msg.T]](sender, msg));
    return msg.T === "data" && !this.coordinator ? this._leadIfNamed(out) : out;
  }

  /** driver.py _lead_if_named: the room named this peer host while it was still joining (no
   * replica yet, so it could not lead then): it leads once its replica is built. */
  async _leadIfNamed(out) {
    if (this.host === this.me && !this.coordinator && this.trainer && this.member.run && !this.member.refused) {
      return [...out, ...this._applied(await this._lead())];
    }
    return out;
  }

  /** `sender` sent bytes that are not a valid message (`reason`). Logged by name; the
   * coordinator counts it as a strike against a member of the run. */
  /** driver.py bad_message: past max(REFUSAL_LINES, strikes) refusals of one sender the rest
   * are dropped without a line. */
  async badMessage(sender, reason) {
    const n = (this.refusals.get(sender) ?? 0) + 1;
    this.refusals.set(sender, n);
    const limit = Math.max(REFUSAL_LINES, this.strikes);
    if (n > limit) return [];
    if (n === limit) reason += `; its next messages that are not valid are dropped without a line (${limit} refused)`;
    if (this.coordinator) return this._applied(await this.coordinator.badMessage(sender, reason));
    return [log(`refused a message from ${this._name(sender)}: ${reason}`, true)];
  }

  /** driver.py muted: `sender` sent more bad messages than badMessage logs and is not the
   * coordinator this replica follows: its messages need not even be decoded. */
  muted(sender) {
    return (this.refusals.get(sender) ?? 0) > Math.max(REFUSAL_LINES, this.strikes) && sender !== this.coord;
  }

  /** A compute finished; `term`: the compute's (driver.py computed); `seconds`: how long the
   *  compute itself took (the shell's clock; the coordinator's split uses it: computeTook). */
  async computed(step, task, result, term = null, seconds = null) {
    if (seconds !== null && this.coordinator !== null && (term === null || term === this.coordinator.term)) {
      this.coordinator.computeTook(step, task, seconds);
    }
    return this._applied(await this.role.computed(step, task, result, term));
  }

  /** The dataset fetch finished: a parsed dataset with its fingerprint, or null. */
  async data(ds) {
    return this._leadIfNamed(this._applied(await this.member.data(ds)));
  }
}

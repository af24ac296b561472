// What a role reads of its driver (daisychain/peer/run/context.py): RunContext, a read-only
// view of the room, the clock and the run's settings. A role never writes to the driver; a
// change it needs (the announce's settings, the host named before, the run's length) it
// returns as a setting output (outputs.js setting(name, value)), which the driver applies when
// the role's call returns. The micro-batches each peer did are counted by the driver from the
// committed outputs, and the host's wait for members is the driver's to end once a
// coordinator took it.

/** What a role reads of the driver. */
export const READS = ["me", "now", "open", "room", "names", "host", "prevHost", "capacity", "steps",
  "verifyRate", "strikes", "verifyKey", "aggregate", "windowSize", "kind", "selftest", "waitPeers", "makeTrainer"];
/** What a role may change, by a setting output. */
export const SETTINGS = ["steps", "verifyRate", "strikes", "prevHost", "capacity"];

/** A role's read-only view of `driver` (the names in READS, and _name): a write throws. */
export class RunContext {
  #driver;

  constructor(driver) { this.#driver = driver; }

  _name(peer) { return this.#driver._name(peer); }

  /** The getter of `name` (one per READS entry, below). */
  static _read(name) { return function read() { return this.#driver[name]; }; }
}

for (const name of READS) Object.defineProperty(RunContext.prototype, name, { get: RunContext._read(name) });

// The run protocol by role (docs/MESH.md): the driver RunPeer and what the shells and tests
// import. The driver holds a Member (member.js) and, while it hosts, a Coordinator
// (coordinator.js, holding a Trust: trust.js) built from it; the roles read the driver through
// a read-only RunContext (context.js). One module per role: driver.js, context.js, member.js,
// coordinator.js, trust.js, checks.js, split.js, aggregator.js, rollback.js, state.js; the
// ring aggregator: ring.js (the ring) and ring_roles.js (its member and coordinator sides).

export { MAX_STRIKES, RunPeer, STRIKES, VERIFY_RATE } from "./driver.js";
export { Coordinator, DEADLINE_FACTOR, MIN_DEADLINE_S, START_WAIT_S } from "./coordinator.js";
export { RESTORE_WAIT_S, SYNC_WAIT_S } from "./catchup.js";
export { Member, identityDifferences } from "./member.js";
export { checkedMicro, verdict } from "./checks.js";
export { capacitySplit, finishShares } from "./split.js";
export { Window, windowSteps } from "./rollback.js";
export { checkedState, loadState, tensorBounds } from "./state.js";
export { g3 } from "./util.js";

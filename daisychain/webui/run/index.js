// The run protocol by role (docs/MESH.md): the driver RunPeer and what the shells and tests
// import. One module per role: driver.js, member.js, coordinator.js, trust.js, checks.js,
// split.js, aggregator.js, rollback.js, state.js.

export { MAX_STRIKES, RunPeer, STRIKES, VERIFY_RATE } from "./driver.js";
export { DEADLINE_FACTOR, MIN_DEADLINE_S, RESTORE_WAIT_S, START_WAIT_S, SYNC_WAIT_S } from "./coordinator.js";
export { identityDifferences } from "./member.js";
export { checkedMicro, verdict } from "./checks.js";
export { capacitySplit, finishShares } from "./split.js";
export { Window, windowSteps } from "./rollback.js";
export { checkedState, loadState, tensorBounds } from "./state.js";
export { g3 } from "./util.js";

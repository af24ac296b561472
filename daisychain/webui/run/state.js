// The one state loader (daisychain/peer/run/state.py): a replica takes a whole state (a member's
// sync or late join, the coordinator catching up with a member ahead, a restore, a
// rollback, a resumed checkpoint) only through loadState, after checkedState made sure it
// fits the run. A state is {step, theta, m, v, b1t, b2t} (a STATE message's fields).

import { paramsSha256 } from "../engine/trainer.js";

/** Segment bounds of a contribution: one segment per canonical tensor (a local-steps run's,
 *  engine/local.js: then one per block of P moment halves). */
export function tensorBounds(trainer) {
  const out = [0];
  let off = 0;
  for (const [, shape] of trainer.spec.paramShapes()) {
    off += shape.reduce((a, b) => a * b, 1);
    out.push(off);
  }
  for (let b = 2 * off; b <= trainer.totalSize; b += off) out.push(b);
  return out;
}

/** A state for `trainer`'s run; throws when it has the wrong size, a non-finite value, an
 * invalid step or parameters that do not hash to `sha` (when given). */
export async function checkedState(trainer, st, sha = null) {
  // the wire form: a local-steps run's differs (engine/local.js stateSizes); a replica that
  // does not say holds one value of each per parameter
  const [n, k] = trainer.stateSizes ?? [trainer.layout.size, trainer.layout.size];
  if (st.theta.length !== n || st.m.length !== k || st.v.length !== k) {
    throw new Error(`the state holds ${st.theta.length} parameters, the run's model ${n}`);
  }
  for (const a of [st.theta, st.m, st.v]) if (!a.every(Number.isFinite)) throw new Error("the state holds non-finite values");
  if (sha) {
    const got = await paramsSha256(st.theta.subarray(0, trainer.layout.size));
    if (sha !== got) throw new Error(`the state's parameters hash to ${got}, not ${sha}`);
  }
  if (!Number.isInteger(st.step) || st.step < 0) throw new Error("the state's step is invalid");
  if (trainer.stateOf) return trainer.stateOf(st);
  return { step: st.step, theta: st.theta, m: st.m, v: st.v, b1t: st.b1t, b2t: st.b2t };
}

export async function loadState(trainer, st) {
  await trainer.load(st);
}

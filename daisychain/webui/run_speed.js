// A device's speed on the run's own model: the micro-batches per second that the split and
// the time left use. The self-test measures a probe model (the digits MLP) before any run;
// a run's model can be 100x heavier (the default CNN), so every device measures again on
// the run's model (its spec and micro-batch, on the path it computes on) when the run starts.

import { microBatchRate } from "./engine/conformance.js";

/** Micro-batches of `microBatch` samples per second through `spec` on `units` (the probe
 *  computes micro-batches of 16: the rate is scaled to the run's size). */
export async function rateOnModel(units, spec, microBatch, minMs = 150) {
  const per16 = await microBatchRate(units, { spec, minMs });
  return (per16 * 16) / Math.max(1, microBatch);
}

/** Measure `mesh`'s device on the run's model and make it the capacity its ready message
 *  carries (RunPeer.capacity), so the split and the time left follow the run's model; says
 *  so on the bus (run:capacity). {capacity, probe}, or null when the measure failed. */
export async function measureRun(mesh, spec, hyper) {
  try {
    const capacity = await rateOnModel(mesh.device.units, spec, hyper.micro_batch);
    if (mesh.peer) mesh.peer.capacity = capacity;
    mesh.bus.emit("run:capacity", { capacity, probe: mesh.device.capacity });
    return { capacity, probe: mesh.device.capacity };
  } catch (err) {
    console.warn(`mesh: measuring the run's model failed (${err.message}); the probe's capacity stays`);
    return null;
  }
}

/** A room member's capacity on the run's model, as this device knows it: the coordinator's
 *  (each member measured it on the run's model for its ready message), this device's own
 *  measure, else the self-test probe's; `inTasks` is what the coordinator keeps measuring
 *  during the run (its tasks' micro-batches per second, the link's round trip included).
 *  {capacity, onModel, inTasks}. */
export function capacityOf(peer, member, runCapacity) {
  const crew = peer?.coordinator?.crew?.get?.(member.id);
  const mine = member.id === peer?.me && runCapacity && peer?.run ? runCapacity.capacity : null;
  const inTasks = crew?.secPerMicro > 0 && crew.secPerMicro !== 1 / crew.capacity ? 1 / crew.secPerMicro : null;
  if (crew?.capacity > 0) return { capacity: crew.capacity, onModel: true, inTasks };
  if (mine !== null) return { capacity: mine, onModel: true, inTasks: null };
  return { capacity: member.capacity, onModel: false, inTasks: null };
}

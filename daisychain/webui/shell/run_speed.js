// A device's speed on the run's own model: the micro-batches per second that the split and
// the time left use. The self-test measures a probe model (the digits MLP) before any run;
// a run's model can be 100x heavier (the default CNN), so every device measures again on
// the run's model when the run starts, where the run computes: in the compute worker (the
// page's thread computes nothing), by timing forward passes over test samples (the worker's
// accuracy op: no micro-batch is counted and the parameters are only read). A micro-batch's
// forward and backward cost about BACKWARD_FACTOR forwards of it.

import { microBatchRate } from "../engine/conformance.js";
import { isLocal, nMicro } from "../engine/spec.js";

export const BACKWARD_FACTOR = 3;

/** Micro-batches of `microBatch` samples per second that `trainer` (a WorkerTrainer, or the
 *  page's Trainer without module workers) computes, estimated from timed forward passes. */
export async function rateOnTrainer(trainer, microBatch, minMs = 150, units = null) {
  if (!trainer.worker && units) { // no compute worker (the page's Trainer): the probe's own way
    return ((await microBatchRate(units, { spec: trainer.spec, minMs })) * 16) / Math.max(1, microBatch);
  }
  const n = Math.max(1, Math.min(trainer.ds.y_test.data.length, 4 * microBatch));
  await trainer.accuracy("test", Math.min(n, microBatch)); // the first call builds what it needs
  let runs = 0;
  let dt = 0;
  const t0 = performance.now();
  while (dt < minMs || runs < 2) {
    await trainer.accuracy("test", n);
    runs++;
    dt = performance.now() - t0;
  }
  return (runs * n) / (dt / 1000) / BACKWARD_FACTOR / microBatch;
}

/** The run's tasks per second at `microRate` micro-batches per second: a local-steps run's
 *  task is one replica's round, `sync_every` inner steps of `batch / micro_batch` micro-batches
 *  each (what engine/capacity.py measure_capacity times on a local-steps trainer: its rounds
 *  per second); a synchronous run's task is a micro-batch. The coordinator's deadlines and a
 *  member's first timing are in these units, and a mixed room's capacities must share them. */
export function taskRate(microRate, hyper) {
  return isLocal(hyper) ? microRate / (hyper.sync_every * nMicro(hyper)) : microRate;
}

/** Measure `mesh`'s device on the run's model (`trainer`) and make it the capacity its ready
 *  message carries (RunPeer.capacity: in the run's tasks, taskRate), so the split and the
 *  time left follow the run's model; says so on the bus (run:capacity, in micro-batches per
 *  second). {capacity, probe}, or null when the measure failed. */
export async function measureRun(mesh, trainer, hyper) {
  try {
    const capacity = await rateOnTrainer(trainer, hyper.micro_batch, 150, mesh.device.units);
    const tasks = taskRate(capacity, hyper);
    if (mesh.peer) mesh.peer.capacity = tasks;
    mesh.bus.emit("run:capacity", { capacity, probe: mesh.device.capacity });
    return { capacity, probe: mesh.device.capacity, tasks };
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
  const mine = member.id === peer?.me && runCapacity && peer?.run ? runCapacity.tasks ?? runCapacity.capacity : null;
  const inTasks = crew?.secPerMicro > 0 && crew.secPerMicro !== 1 / crew.capacity ? 1 / crew.secPerMicro : null;
  if (crew?.capacity > 0) return { capacity: crew.capacity, onModel: true, inTasks };
  if (mine !== null) return { capacity: mine, onModel: true, inTasks: null };
  return { capacity: member.capacity, onModel: false, inTasks: null };
}

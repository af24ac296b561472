// The host's Start: the settings checked (same meaning and defaults as `daisychain train`),
// the data fetched, the model built and measured on this device, the run identity hashed
// and, with a checkpoint to resume from, checked to make the same run. Mesh.start (mesh.js)
// then announces it.

import { makeHyper, modelFor, RECIPE_FIELDS, recipeSettings } from "../engine/spec.js";
import { TASK_DEFAULTS } from "../engine/task_defaults.js";
import { runId, runIdentity } from "../engine/trainer.js";
import { identityDifferences } from "../run/index.js";
import { createTrainer } from "./worker/trainer_proxy.js";

/**
 * Everything a run needs before it is announced: {trainer, identity, id, task, steps,
 * verify_rate, aggregate}. `resume` (a checked checkpoint state, see checkpoint.js) starts it
 * from that state, if the settings make the same run. `layers` (the `--layers` items) wins
 * over `hidden` (one hidden layer, `--hidden`) when given; an image task without `layers`
 * trains its default CNN. The learning rate and the image recipe's fields left null take the task's defaults
 * (spec.js recipeSettings), or with `resume` the checkpoint's. `context` (the text task's
 * `--context`) trains on the data windowed with it, as the server makes it. A setting the
 * run cannot take throws, with the tab back to idle.
 */
export async function prepareRun(mesh, { task = null, steps = 600, seed = 0, batch = 64, micro_batch = 16, lr = null, hidden = 128, layers = null, dataset = null,
  augment_shift = null, lr_warmup = null, lr_decay_steps = null, replicas = 1, sync_every = 1, outer_lr = 1.0,
  outer_momentum = 0.5, moments_every = 8, verify_rate = null, aggregate = null, context = null } = {}, resume = null) {
  if (!mesh.net.room || mesh.net.room.host !== mesh.net.id) throw new Error("only the host starts a run");
  if (verify_rate !== null && !(Number.isFinite(verify_rate) && verify_rate >= 0 && verify_rate <= 1)) throw new Error("the verify rate must be in [0, 1]");
  if (aggregate !== null && !["auto", "star", "ring"].includes(aggregate)) throw new Error("the aggregation must be one of auto, star, ring");
  if (aggregate === "ring" && (verify_rate ?? mesh.peer?.verifyRate ?? 0.05) > 0) throw new Error("ring needs spot-checks off: a ring hides each contribution from them");
  if (mesh.peer?.coordinating && !mesh.peer.ended) throw new Error("a run is already going");
  const fp = dataset ? String(dataset.fingerprint || "") : null;
  if (dataset && !/^[0-9a-f]{64}$/.test(fp)) throw new Error("the chosen dataset has no valid fingerprint (a /datasets entry has one)");
  if (dataset && task && dataset.task !== task) throw new Error(`the chosen dataset is for the ${dataset.task} task, not ${task}`);
  task = dataset ? String(dataset.task) : task || "digits";
  if (!Number.isInteger(steps) || steps < 0) throw new Error("steps must be a whole number >= 0");
  const given = { augment_shift, lr_warmup, lr_decay_steps };
  if (resume) for (const k of RECIPE_FIELDS) given[k] ??= resume.identity?.hyper?.[k] ?? 0;
  lr ??= TASK_DEFAULTS[task]?.lr ?? TASK_DEFAULTS.digits.lr; // the task's, as `daisychain train`
  const hyper = makeHyper({ seed, batch, micro_batch, lr, ...recipeSettings(task, steps, given),
    replicas, sync_every, outer_lr, outer_momentum, moments_every });
  const label = dataset?.name ? `the dataset ${dataset.name}` : `the ${task} data`;
  mesh._state("starting", `preparing the ${task} run`);
  mesh._preparing("data", 0, 4, `fetching ${label}`);
  let ds;
  try {
    ds = await mesh.loadData(task, fp, label, context);
  } catch (err) {
    mesh._state("idle", err.message);
    throw err;
  }
  mesh._preparing("model", 1, 4, "building the model");
  let spec, trainer, identity, id;
  try { // a model the data cannot hold: back to idle with the reason (the page's fields)
    spec = modelFor(ds, layers ?? (ds.kind === "image" ? null : hidden), 16);
    trainer = await createTrainer({ spec, hyper, dataset: ds, luts: mesh.device.luts, units: mesh.device.units, kind: mesh.device.kind, cpuPath: mesh.device.cpuPath });
    mesh._preparing("model", 1, 4, "measuring this device on the run's model");
    await mesh._measureRun(trainer, hyper);
    mesh._preparing("identity", 2, 4, "hashing the run identity");
    identity = runIdentity(spec, hyper, ds, mesh.device.luts);
    id = await runId(identity);
  } catch (err) {
    mesh._state("idle", err.message);
    throw err;
  }
  if (resume) {
    const diffs = identityDifferences(identity, resume.identity).map((d) => d.replace(" in the run", " in the checkpoint"));
    const why = diffs.length ? `these settings make another run than the loaded checkpoint's: ${diffs.join("; ")}`
      : resume.step > steps ? `the checkpoint is at step ${resume.step}, past the ${steps} steps of the run` : null;
    if (why) {
      mesh._state("idle", why);
      throw new Error(why);
    }
    trainer.load(resume); // the one state loader (Trainer.load), as sync and restore use
  }
  return { trainer, identity, id, task, steps, verify_rate, aggregate };
}

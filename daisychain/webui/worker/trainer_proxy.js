// A Trainer whose compute runs in a Web Worker (compute_worker.js), so a tab that trains keeps
// answering: the page's main thread only sends messages and waits.
//
//   const tr = await WorkerTrainer.create({ spec, hyper, dataset, luts, units, kind });
//   await tr.contribute([0, 2]);        // computed in the worker, same bits as Trainer's
//   await tr.contributeAt(theta, step, micro);
//   await tr.accuracy("test", 500);     // the first 500 test samples, in the worker
//   tr.apply(total);                    // the replica's state stays here (see below)
//
// It is a Trainer (same fields, same methods): the replica's state (theta, Adam, step), the
// schedule and apply() stay on the page, where the run protocol (runpeer.js) reads them
// between two messages; they cost a few milliseconds a step. What takes seconds (the
// gradient of the micro-batches, the accuracy, a prediction) is sent with a copy of the
// parameters to the worker, which runs the same Trainer code on its own units.

import { LocalTrainer } from "../engine/local.js";
import { isLocal } from "../engine/spec.js";
import { Trainer } from "../engine/trainer.js";

let shared = null; // the page's one compute worker

/** The page's compute worker: {post(op, body, transfer) -> Promise}. */
export function computeWorker() {
  if (shared) return shared;
  const worker = new Worker(new URL("./compute_worker.js", import.meta.url), { type: "module" });
  const waiting = new Map();
  let next = 1;
  worker.onmessage = (ev) => {
    const { id, ok, result, error } = ev.data;
    const w = waiting.get(id);
    if (!w) return;
    waiting.delete(id);
    if (ok) w.resolve(result); else w.reject(new Error(error));
  };
  worker.onerror = (ev) => {
    const err = new Error(`the compute worker failed: ${ev.message || "it could not start"}`);
    for (const w of waiting.values()) w.reject(err);
    waiting.clear();
  };
  shared = {
    worker,
    post(op, body = {}, transfer = []) {
      const id = next++;
      return new Promise((resolve, reject) => {
        waiting.set(id, { resolve, reject });
        worker.postMessage({ id, op, ...body }, transfer);
      });
    },
  };
  return shared;
}

/** Whether this browser can run the compute in a module worker. */
export function workersAvailable() {
  return typeof Worker !== "undefined";
}

let keys = 0;

export class WorkerTrainer extends Trainer {
  /** As Trainer.create, plus `kind` ("webgpu" | "cpu": the units the worker opens). */
  static async create(o) {
    const tr = new WorkerTrainer(o);
    tr.worker = computeWorker();
    tr.key = ++keys;
    const ds = o.dataset;
    const dataset = { task: ds.task, kind: ds.kind, classes: ds.classes, meta: ds.meta,
      x_train: ds.x_train, y_train: ds.y_train, x_test: ds.x_test, y_test: ds.y_test };
    const luts = { ...o.luts };
    const info = await tr.worker.post("init", { key: tr.key, spec: o.spec.toJson(), hyper: { ...o.hyper },
      dataset, luts, kind: o.kind || (o.units && o.units.name === "gpu" ? "webgpu" : "cpu"),
      cpuPath: o.cpuPath || (o.units && o.units.name === "wasm" ? "wasm" : "js") });
    tr.workerUnits = info.units;
    tr.workerGpuReason = info.gpuReason;
    return tr;
  }

  /** Switch compute path (after a GPU failure): here and in the worker; the bits do not change. */
  setUnits(units) {
    super.setUnits(units);
    this.worker.post("setUnits", { kind: units.name === "gpu" ? "webgpu" : "cpu" }).catch(() => {});
  }

  async contribute(microIds, step = this.step, theta = this.theta) {
    return this.contributeAt(theta.slice(), step, microIds);
  }

  /** Trainer.contribute on a parameter snapshot (mesh.js contributeAt), in the worker. */
  async contributeAt(theta, step, micro) {
    const own = theta.buffer.byteLength === theta.byteLength ? theta : theta.slice();
    // The snapshot is handed over, not copied, where no one uses it again: on the JS units
    // (mesh.js retries a failed compute with the same snapshot only after a GPU failure).
    const hand = this.engine.units.name !== "gpu" ? [own.buffer] : [];
    return this.worker.post("contribute", { key: this.key, theta: own, step, micro: Array.from(micro) }, hand);
  }

  /** Accuracy on the first `limit` samples of a split (all when null), parameters untouched. */
  async accuracy(split = "test", limit = null) {
    const r = await this.worker.post("accuracy", { key: this.key, theta: this.theta.slice(), split, limit });
    return r.accuracy;
  }

  /** Class probabilities of n input rows x (Float64Array or Int32Array), row-major. */
  async probs(x, n) {
    const r = await this.worker.post("probs", { key: this.key, theta: this.theta.slice(), x, n });
    return r.probs;
  }

  /** Predicted classes of rows `index` of a split (the gallery), in the worker. */
  async predictions(split, index) {
    const r = await this.worker.post("predict", { key: this.key, theta: this.theta.slice(), split, index: Array.from(index) });
    return r.pred;
  }

  /** The confusion matrix of a split ({classes, counts, n, correct}), in the worker. */
  async confusion(split = "test") {
    return this.worker.post("confusion", { key: this.key, theta: this.theta.slice(), split });
  }
}

/** The trainer a tab runs: a WorkerTrainer where the browser has module workers, else a
 *  Trainer; a local-steps run's LocalTrainer (engine/local.js) computes on the page's
 *  thread (its rounds need every replica's moments, which stay on the page). */
export function createTrainer(o) {
  if (isLocal(o.hyper)) return LocalTrainer.create(o);
  return workersAvailable() ? WorkerTrainer.create(o) : Trainer.create(o);
}

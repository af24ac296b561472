// A Trainer whose compute runs in a pool of Web Workers (compute_worker.js), so a tab that
// trains keeps answering and uses every core: the page's main thread only sends messages and
// waits. The pool's size is poolSetting() (hardwareConcurrency less one, or ?workers=N).
//
//   const tr = await WorkerTrainer.create({ spec, hyper, dataset, luts, units, kind });
//   await tr.contribute([0, 2]);        // computed in the worker, same bits as Trainer's
//   await tr.contributeAt(theta, step, micro);
//   await tr.accuracy("test", 500);     // the first 500 test samples, in the worker
//   tr.apply(total);                    // the replica's state stays here (see below)
//
// It is a Trainer (same fields, same methods): the replica's state (theta, Adam, step), the
// schedule and apply() stay on the page, where the run protocol (webui/run/) reads them
// between two messages; they cost a few milliseconds a step. What takes seconds (the
// gradient of the micro-batches, the accuracy, a prediction) is sent with a copy of the
// parameters to the worker, which runs the same Trainer code on its own units.

import { LocalTrainer } from "../../engine/local.js";
import { isLocal } from "../../engine/spec.js";
import { Trainer } from "../../engine/trainer.js";

/** The most compute workers a tab starts (each holds a copy of the training set). */
export const MAX_WORKERS = 8;

/** The least one-worker time (ms) of each worker's share of a call for the default pool to
 *  split it: a digits micro-batch (~0.1 ms) costs less than its round trip to a second worker
 *  (2 workers ran digits at 0.67x of one, docs/BENCHMARKS.md "browser_pool"). engine/threads.py
 *  MIN_SHARE_S is the same rule for `--threads`. */
export const MIN_SHARE_MS = 2;

/**
 * How many of the pool's workers compute a call of n micro-batches on the CPU path: all of
 * them (at most n) when the address asked for the pool (`?workers=N`); else one until a call
 * has measured the rate (perMicroMs: one worker's ms a micro-batch, the least seen), then as
 * many as keep each share at least MIN_SHARE_MS. The bits never depend on it.
 */
export function workersFor(n, size, asked, perMicroMs, minShareMs = MIN_SHARE_MS) {
  const k = Math.min(size, n);
  if (k <= 1) return 1;
  if (asked) return k;
  if (perMicroMs === null) return 1;
  return Math.max(1, Math.min(k, Math.floor((n * perMicroMs) / minShareMs)));
}

/**
 * The next run of micro-batches a worker pulls when `left` remain for n workers: a quarter of
 * a worker's even share, max(1, floor(left / 2n)), so the last runs are small enough to even
 * out a slowed worker; but at least MIN_SHARE_MS of one worker's time where a micro-batch is
 * known to be cheaper than a message's round trip (perMicroMs), at most an even share.
 */
export function pullRun(left, n, perMicroMs, minShareMs = MIN_SHARE_MS) {
  const fine = Math.max(1, Math.floor(left / (2 * n)));
  if (perMicroMs === null || perMicroMs <= 0) return fine;
  return Math.min(Math.max(fine, Math.ceil(minShareMs / perMicroMs)), Math.ceil(left / n));
}

/**
 * How many compute workers this tab runs: `?workers=N` in the page's address (1..MAX_WORKERS),
 * else navigator.hardwareConcurrency less one for the page, at least 1, at most MAX_WORKERS.
 * @returns {{size: number, cores: number|null, why: string}}
 */
export function poolSetting(search = globalThis.location ? globalThis.location.search : "",
  cores = globalThis.navigator ? globalThis.navigator.hardwareConcurrency : null) {
  const c = Number.isInteger(cores) && cores > 0 ? cores : null;
  const asked = new URLSearchParams(search).get("workers");
  if (asked !== null) {
    const n = Number(asked);
    if (Number.isInteger(n) && n >= 1 && n <= MAX_WORKERS) {
      return { size: n, asked: true, cores: c, why: `workers=${n} in the address${c !== null && n > c ? ` (more than the ${c} cores: allowed)` : ""}` };
    }
    const size = c === null ? 1 : Math.min(MAX_WORKERS, Math.max(1, c - 1));
    return { size, cores: c, why: `workers=${asked} refused: it must be an integer from 1 to ${MAX_WORKERS}; using ${size}` };
  }
  if (c === null) return { size: 1, cores: null, why: "the browser does not say how many cores it has" };
  const size = Math.min(MAX_WORKERS, Math.max(1, c - 1));
  return { size, cores: c, why: `${c} cores, one left for the page${c - 1 > MAX_WORKERS ? `, at most ${MAX_WORKERS}` : ""}` };
}

function startWorker() {
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
  return {
    worker,
    post(op, body = {}, transfer = []) {
      const id = next++;
      return new Promise((resolve, reject) => {
        waiting.set(id, { resolve, reject });
        worker.postMessage({ id, op, ...body }, transfer);
      });
    },
  };
}

let shared = null; // the page's one pool of compute workers

/**
 * The page's pool of compute workers (poolSetting): {size, setting, workers, post(op, body,
 * transfer) to the first worker, all(op, body) -> one answer per worker, counts()}.
 */
export function computePool() {
  if (shared) return shared;
  const setting = poolSetting();
  const workers = Array.from({ length: setting.size }, startWorker);
  shared = {
    size: workers.length,
    setting,
    workers,
    post: (op, body, transfer) => workers[0].post(op, body, transfer),
    all: (op, body = {}) => Promise.all(workers.map((w) => w.post(op, body))),
    /** micro-batches and accuracy calls computed, summed over the pool */
    async counts() {
      const each = await Promise.all(workers.map((w) => w.post("counts")));
      return { micro: each.reduce((s, c) => s + c.micro, 0), accuracy: each.reduce((s, c) => s + c.accuracy, 0),
        perWorker: each.map((c) => c.micro) };
    },
  };
  return shared;
}

/** The pool's first worker, as the page's one compute worker was ({post}). */
export function computeWorker() {
  return computePool();
}

/** The pool's whole micro-batch rate: every worker measures at once (conformance.js
 *  microBatchRate on its own units), the rates add up. */
export async function poolRate(luts, cpuPath) {
  const pool = computePool();
  const rates = await pool.all("rate", { luts: { ...luts }, cpuPath });
  return { total: rates.reduce((s, r) => s + r.rate, 0), each: rates.map((r) => r.rate), units: rates.map((r) => r.units) };
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
    tr.pool = computePool();
    tr.worker = tr.pool;
    tr.key = ++keys;
    // How a call's micro-batches go to its workers: "static" (one contiguous run each, one
    // message), or "pull" (each takes the next run when it answers: a worker that other work
    // slowed takes fewer, at a message, a parameter copy and a weights' quantize a run). On a
    // quiet machine static ran 1.59x / 1.75x one worker (batch 64 / 256), pull 1.47x / 1.61x
    // (bench/browser_pool.py, medians of 5 rounds, load 1.0-3.6), so static is the default.
    // The bits are the same.
    tr.split = "static";
    const ds = o.dataset;
    const dataset = { task: ds.task, kind: ds.kind, classes: ds.classes, meta: ds.meta,
      x_train: ds.x_train, y_train: ds.y_train, x_test: ds.x_test, y_test: ds.y_test };
    const luts = { ...o.luts };
    const kind = o.kind || (o.units && o.units.name === "gpu" ? "webgpu" : "cpu");
    const body = { key: tr.key, spec: o.spec.toJson(), hyper: { ...o.hyper }, dataset, luts, kind,
      cpuPath: o.cpuPath || (o.units && o.units.name === "wasm" ? "wasm" : "js") };
    // A WebGPU tab computes on its one GPU, from the first worker; the CPU path on every worker.
    const infos = kind === "webgpu" ? [await tr.pool.post("init", body)] : await tr.pool.all("init", body);
    tr.workerUnits = infos[0].units;
    tr.workerGpuReason = infos[0].gpuReason;
    tr.workerWasmReason = infos[0].wasmReason;
    tr.poolUnits = infos.map((i) => i.units);
    return tr;
  }

  /** Switch compute path (after a GPU failure): here and in the worker; the bits do not change. */
  setUnits(units) {
    super.setUnits(units);
    const kind = units.name === "gpu" ? "webgpu" : "cpu";
    if (kind === "cpu" && this.poolUnits && this.poolUnits.length < this.pool.size) this.poolUnits = null; // the others need an init
    this.pool.post("setUnits", { kind }).catch(() => {});
  }

  async contribute(microIds, step = this.step, theta = this.theta) {
    return this.contributeAt(theta.slice(), step, microIds);
  }

  /**
   * Trainer.contribute on a parameter snapshot (mesh.js contributeAt), in the workers: on the
   * CPU path the workers pull contiguous runs of the micro-batches from one queue (split),
   * and the answers are merged. Each contribution is a sum of exact integers (fixed point), so the sum of
   * the workers' sums is the same bits in any order; loss and correct keep the micro order.
   * On the CPU path the snapshot is handed over (the caller does not use it again): it is
   * sent, or kept for the next call's copies (_spare).
   */
  async contributeAt(theta, step, micro) {
    const ids = Array.from(micro);
    const gpu = this.engine.units.name === "gpu";
    const n = gpu || !this.poolUnits ? 1
      : workersFor(ids.length, this.pool.size, !!this.pool.setting.asked, this.perMicroMs ?? null);
    const t0 = performance.now();
    const seen = (r, workers) => {
      // the least ms a micro-batch took one worker (a split call's wall time times its workers
      // bounds that from above)
      const ms = ids.length ? ((performance.now() - t0) * workers) / ids.length : null;
      if (ms !== null && !gpu) this.perMicroMs = this.perMicroMs == null ? ms : Math.min(this.perMicroMs, ms);
      return r;
    };
    if (n <= 1) {
      // The snapshot is handed over, not copied, where no one uses it again: on the CPU path
      // (mesh.js retries a failed compute with the same snapshot only after a GPU failure).
      const own = !gpu && theta.buffer.byteLength === theta.byteLength ? theta : this._copy(theta);
      const grad = this._spare(this.layout.size);
      const r = await this.pool.post("contribute", { key: this.key, theta: own, grad, step, micro: ids }, [own.buffer, grad.buffer]);
      this._keep(r.theta);
      return seen({ grad: r.grad, loss: r.loss, correct: r.correct }, 1);
    }
    // each answer is added to the first as it comes, while the others still compute
    let grad = null;
    const loss = new Float64Array(ids.length);
    const correct = new Int32Array(ids.length);
    const add = (p) => {
      loss.set(p.loss, p.at);
      correct.set(p.correct, p.at);
      if (grad === null) grad = p.grad;
      else {
        for (let i = 0; i < grad.length; i++) grad[i] += p.grad[i];
        this._keep(p.grad);
      }
    };
    if (this.split === "static") {
      await Promise.all(Array.from({ length: n }, async (_, w) => {
        const at = Math.floor((w * ids.length) / n);
        add(await this._share(w, theta, step, ids, at, Math.floor(((w + 1) * ids.length) / n) - at));
      }));
    } else await this._pulled(n, theta, step, ids, add);
    // the snapshot was handed over (as above): it replaces the contribution that leaves
    this._keep(theta);
    seen(null, n);
    return { grad, loss, correct };
  }

  /** Micro-batches ids[at, at + size) of a step on worker w: {grad, loss, correct, at}.
   *  Where `trace` is an array (bench/browser_pool.py --timeline), each share is recorded in
   *  it: {w, step, post, start, end, back}, ms since the epoch (the page posted it, the worker
   *  began and ended its compute, the answer reached the page). */
  async _share(w, theta, step, ids, at, size) {
    const own = this._copy(theta);
    const grad = this._spare(this.layout.size);
    const post = performance.timeOrigin + performance.now();
    const r = await this.pool.workers[w].post("contribute", { key: this.key, theta: own, grad, step, micro: ids.slice(at, at + size) },
      [own.buffer, grad.buffer]);
    this._keep(r.theta);
    if (Array.isArray(this.trace)) {
      this.trace.push({ w, step, post, start: r.span[0], end: r.span[1], back: performance.timeOrigin + performance.now() });
    }
    return { grad: r.grad, loss: r.loss, correct: r.correct, at };
  }

  /** The micro-batches of a call pulled by n workers from one queue: each worker takes the
   *  next run when it answers its last, so a worker that another process or the page slowed
   *  takes fewer; the answers' runs, in any order. */
  async _pulled(n, theta, step, ids, add) {
    let next = 0;
    const pull = async (w) => {
      while (next < ids.length) {
        const at = next;
        const size = pullRun(ids.length - at, n, this.perMicroMs ?? null);
        next += size;
        add(await this._share(w, theta, step, ids, at, size));
      }
    };
    await Promise.all(Array.from({ length: n }, (_, w) => pull(w)));
  }

  /** A Float64Array of n values from the arrays that came back from the workers (a snapshot's
   *  copy, a summed contribution), else a new one. Each call hands a worker a parameter copy
   *  and an array for its contribution, and each comes back: a new 232 KB array (the default
   *  CNN) costs its ~57 pages' first-touch faults, on the page and in the worker, every call
   *  (docs/BENCHMARKS.md "A tab's pool of compute workers"). */
  _spare(n) {
    const s = this.spares || (this.spares = []);
    const i = s.findIndex((a) => a.length === n);
    return i >= 0 ? s.splice(i, 1)[0] : new Float64Array(n);
  }

  /** A copy of theta in a spare array. */
  _copy(theta) {
    const own = this._spare(theta.length);
    own.set(theta);
    return own;
  }

  /** Keep an array that came back (at most 2 per worker, and 2 more). */
  _keep(a) {
    const s = this.spares || (this.spares = []);
    if (a instanceof Float64Array && a.buffer.byteLength === a.byteLength && s.length < 2 * this.pool.size + 2) s.push(a);
  }

  /** Accuracy on the first `limit` samples of a split (all when null), parameters untouched
   *  (`theta`: a copy taken earlier, else the parameters now). */
  async accuracy(split = "test", limit = null, theta = null) {
    const r = await this.worker.post("accuracy", { key: this.key, theta: theta ?? this.theta.slice(), split, limit });
    return r.accuracy;
  }

  /** Class probabilities of n input rows x (Float64Array or Int32Array), row-major. */
  async probs(x, n) {
    const r = await this.worker.post("probs", { key: this.key, theta: this.theta.slice(), x, n });
    return r.probs;
  }

  /** Predicted classes of rows `index` of a split (the gallery), in the worker (`theta`: a
   *  copy taken earlier, else the parameters now). */
  async predictions(split, index, theta = null) {
    const r = await this.worker.post("predict", { key: this.key, theta: theta ?? this.theta.slice(), split, index: Array.from(index) });
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

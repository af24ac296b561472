// Model specs and hyperparameters, mirroring daisychain/engine/spec.py: the same JSON, the
// same validation, the same canonical parameter order.

import { MAX_K } from "../gemm.js";

export const MAX_FEATURES = Math.floor((2147483647 - 1073741824) / (127 * 127));
export const MAX_PARAMS = 50_000_000;

export class SpecError extends Error {
  constructor(message) {
    super(message);
    this.name = "SpecError";
  }
}

/** @typedef {{type: "linear"|"relu"|"embedding", nIn: number, nOut: number}} Layer */

export class ModelSpec {
  constructor(layers, inputKind, inputDim, classes) {
    this.layers = layers;
    this.inputKind = inputKind;
    this.inputDim = inputDim;
    this.classes = classes;
  }

  static fromJson(obj) {
    let spec;
    try {
      const layers = obj.layers.map((l) => {
        if (l.type === "linear") return { type: "linear", nIn: int(l.in), nOut: int(l.out) };
        if (l.type === "embedding") return { type: "embedding", nIn: int(l.vocab), nOut: int(l.dim) };
        if (l.type === "relu") return { type: "relu", nIn: 0, nOut: 0 };
        throw new SpecError(`unknown layer type ${JSON.stringify(l.type)}`);
      });
      spec = new ModelSpec(layers, String(obj.input.kind), int(obj.input.dim), int(obj.classes));
    } catch (err) {
      if (err instanceof SpecError) throw err;
      throw new SpecError(`malformed model spec: ${err.message}`);
    }
    spec.validate();
    return spec;
  }

  toJson() {
    return {
      input: { kind: this.inputKind, dim: this.inputDim }, classes: this.classes,
      layers: this.layers.map((l) => (l.type === "linear" ? { type: "linear", in: l.nIn, out: l.nOut }
        : l.type === "embedding" ? { type: "embedding", vocab: l.nIn, dim: l.nOut } : { type: "relu" })),
    };
  }

  /** Canonical parameter order: by layer, weight then bias. [[name, shape], ...] */
  paramShapes() {
    const out = [];
    this.layers.forEach((l, i) => {
      if (l.type === "linear") out.push([`layers.${i}.weight`, [l.nOut, l.nIn]], [`layers.${i}.bias`, [l.nOut]]);
      else if (l.type === "embedding") out.push([`layers.${i}.weight`, [l.nIn, l.nOut]]);
    });
    return out;
  }

  validate() {
    const L = this.layers;
    if (!L.length) throw new SpecError("a model needs at least one layer");
    if (this.inputKind !== "dense" && this.inputKind !== "tokens") {
      throw new SpecError(`input kind must be 'dense' or 'tokens', got '${this.inputKind}'`);
    }
    let width = this.inputDim;
    L.forEach((l, i) => {
      if (l.type === "embedding") {
        if (i !== 0 || this.inputKind !== "tokens") throw new SpecError("an embedding must be the first layer of a 'tokens' model");
        if (l.nIn < 1 || l.nOut < 1) throw new SpecError("embedding vocab and dim must be >= 1");
        width = this.inputDim * l.nOut;
      } else if (l.type === "linear") {
        if (l.nIn !== width) throw new SpecError(`layer ${i}: linear expects ${l.nIn} inputs, gets ${width}`);
        if (!(l.nIn >= 1 && l.nIn <= MAX_FEATURES) || l.nOut < 1) {
          throw new SpecError(`layer ${i}: linear in-features must lie in [1, ${MAX_FEATURES}] so its int32 accumulator cannot overflow`);
        }
        if (l.nOut > MAX_K) throw new SpecError(`layer ${i}: out-features above ${MAX_K} would overflow the error GEMM`);
        width = l.nOut;
      } else if (l.type === "relu") {
        if (i === 0 || L[i - 1].type !== "linear" || i === L.length - 1) {
          throw new SpecError(`layer ${i}: relu must follow a hidden linear layer`);
        }
      } else {
        throw new SpecError(`layer ${i}: unknown type '${l.type}'`);
      }
    });
    if (this.inputKind === "tokens" && L[0].type !== "embedding") throw new SpecError("a 'tokens' model must start with an embedding");
    const last = L[L.length - 1];
    if (last.type !== "linear" || last.nOut !== this.classes) throw new SpecError(`the last layer must be linear(.., ${this.classes})`);
    const n = this.paramShapes().reduce((s, [, sh]) => s + sh.reduce((a, b) => a * b, 1), 0);
    if (n > MAX_PARAMS) throw new SpecError(`${n} parameters is more than this engine trains (${MAX_PARAMS})`);
  }
}

function int(x) {
  const v = Number(x);
  if (!Number.isInteger(v)) throw new SpecError(`expected an integer, got ${JSON.stringify(x)}`);
  return v;
}

/** spec.py MAX_HIDDEN_LAYERS: most hidden layers a `layers` setting may name. */
export const MAX_HIDDEN_LAYERS = 16;

/** spec.py hidden_widths: 128 -> [128] (`depth` times); [256, 256] -> [256, 256]. */
export function hiddenWidths(hidden, depth = 1) {
  const widths = typeof hidden === "number" ? Array(depth).fill(hidden) : Array.from(hidden ?? []);
  if (!widths.every(Number.isInteger)) throw new SpecError(`hidden widths must be integers, got ${JSON.stringify(widths)}`);
  if (widths.length < 1 || widths.length > MAX_HIDDEN_LAYERS) {
    throw new SpecError(`a model has 1 to ${MAX_HIDDEN_LAYERS} hidden layers, not ${widths.length}`);
  }
  if (widths.some((w) => w < 1)) throw new SpecError(`hidden widths must be >= 1, got ${widths.join(",")}`);
  return widths;
}

/** settings.py parse_layers: "256,256" -> [256, 256] (the `--layers` / `?layers=` text). */
export function parseLayers(text) {
  const parts = String(text).split(",").map((t) => t.trim());
  if (parts.length > MAX_HIDDEN_LAYERS) throw new SpecError(`at most ${MAX_HIDDEN_LAYERS} hidden layers`);
  if (!parts.every((t) => /^[+-]?[0-9]+$/.test(t))) {
    throw new SpecError(`--layers takes comma-separated hidden widths such as 256,256, not ${JSON.stringify(String(text))}`);
  }
  return hiddenWidths(parts.map((t) => parseInt(t, 10)));
}

/** spec.py hidden_of: the hidden widths (out-features of every linear but the last) of a
 *  ModelSpec or of its JSON (`{layers: [{type: "linear", out}, ...]}`). */
export function hiddenOf(spec) {
  return spec.layers.filter((l) => l.type === "linear").map((l) => l.nOut ?? l.out).slice(0, -1);
}

function stack(width, widths, classes) {
  const layers = [];
  for (const w of widths) {
    layers.push({ type: "linear", nIn: width, nOut: w }, { type: "relu", nIn: 0, nOut: 0 });
    width = w;
  }
  layers.push({ type: "linear", nIn: width, nOut: classes });
  return layers;
}

/** Dense MLP: `hidden` is one width (repeated `depth` times) or the array of widths. */
export function mlp(nIn, hidden, classes, depth = 1) {
  const spec = new ModelSpec(stack(nIn, hiddenWidths(hidden, depth), classes), "dense", nIn, classes);
  spec.validate();
  return spec;
}

/** Char model: an embedding, then the same hidden stack as mlp, then the vocab logits. */
export function charMlp(vocab, context, dim, hidden) {
  const spec = new ModelSpec([{ type: "embedding", nIn: vocab, nOut: dim },
    ...stack(context * dim, hiddenWidths(hidden), vocab)], "tokens", context, vocab);
  spec.validate();
  return spec;
}

/** data.py model_for: the model of a prepared dataset; `layers` is one hidden width (a number,
 *  `--hidden`) or the array of hidden widths (`--layers`). */
export function modelFor(ds, layers = 128, dim = 16) {
  if (typeof layers === "number" && layers < 1) throw new SpecError("--hidden must be >= 1");
  if (ds.kind === "dense") return mlp(ds.x_train.shape[1], layers, ds.classes);
  return charMlp(ds.classes, ds.x_train.shape[1], dim, layers);
}

/** Hyper, with the same field names and defaults as spec.py (snake_case, as on the wire). */
export const HYPER_DEFAULTS = Object.freeze({
  lr: 3e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0,
  batch: 64, micro_batch: 16, grad_frac_bits: 40, seed: 0,
});
/** Hyper fields that are floats in Python (their canonical JSON spelling differs from ints). */
export const HYPER_FLOATS = ["lr", "beta1", "beta2", "eps", "weight_decay"];

export function makeHyper(overrides = {}) {
  const hp = { ...HYPER_DEFAULTS, ...overrides };
  for (const k of Object.keys(hp)) {
    if (!(k in HYPER_DEFAULTS)) throw new SpecError(`unknown hyperparameter ${k}`);
  }
  if (!(hp.micro_batch >= 1 && hp.batch >= 1) || hp.batch % hp.micro_batch) {
    throw new SpecError(`--batch (${hp.batch}) must be a positive multiple of --micro-batch (${hp.micro_batch})`);
  }
  if (hp.micro_batch > 4096) throw new SpecError("--micro-batch above 4096 is not supported");
  // the same checks and words as spec.py Hyper.validate (a run a host sends)
  if (!(hp.lr > 0 && hp.lr <= 1)) throw new SpecError("--lr must be a finite number in (0, 1]");
  if (!(hp.weight_decay >= 0 && hp.weight_decay <= 1)) throw new SpecError("--weight-decay must be a finite number in [0, 1]");
  if (!(hp.beta1 >= 0 && hp.beta1 < 1 && hp.beta2 >= 0 && hp.beta2 < 1 && hp.eps > 0 && hp.eps <= 1)) {
    throw new SpecError("betas must lie in [0, 1) and eps in (0, 1]");
  }
  if (!Number.isInteger(hp.seed) || hp.seed < 0 || hp.seed > 0xffffffff) throw new SpecError("--seed must be an integer in [0, 2**32 - 1]");
  if (!(Number.isInteger(hp.grad_frac_bits) && hp.grad_frac_bits >= 0 && hp.grad_frac_bits <= 60)) {
    throw new SpecError("grad_frac_bits must lie in [0, 60]");
  }
  return Object.freeze(hp);
}

export const nMicro = (hp) => hp.batch / hp.micro_batch;

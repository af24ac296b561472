// Model specs and hyperparameters, mirroring daisychain/engine/spec.py: the same JSON, the
// same validation, the same canonical parameter order.

import { TASK_DEFAULTS, taskDefaults } from "./task_defaults.js";
import { Embedding, int, Linear, MAX_FEATURES, Relu, SpecError } from "./layers.js";
import { Block, PosEmbed, RmsNorm } from "./transformer.js";
import { describeLayers, itemKind, itemStack, kindOf, layerFromJson, legacyJson, readsExp } from "./registry.js";

export const MAX_PARAMS = 50_000_000;
export const INPUT_KINDS = ["dense", "tokens", "image"];
export const MAX_IMAGE_SIDE = 1024; // largest image height or width
export const MAX_CHANNELS = 64; // most image channels
export const LOSSES = ["cross_entropy", "mse"]; // spec.py LOSSES

export { MAX_FEATURES, SpecError };

/** Layers are the classes of layers.js (Linear, Embedding, Relu, Conv2d, MaxPool2d); an
 *  image input is {kind: "image", dim: C*H*W, channels: C, height: H, width: W}. */
export class ModelSpec {
  constructor(layers, inputKind, inputDim, classes, image = null, loss = "cross_entropy") {
    this.layers = layers.map((l) => (typeof l.forward === "function" ? l : layerFromJson(legacyJson(l))));
    this.inputKind = inputKind;
    this.inputDim = inputDim;
    this.classes = classes;
    this.image = image; // {c, h, w} of an image input
    this.loss = loss; // one of LOSSES; left out of the JSON when cross_entropy (spec.py)
  }

  static fromJson(obj) {
    let spec;
    try {
      const layers = obj.layers.map(layerFromJson);
      const kind = String(obj.input.kind);
      const image = kind === "image"
        ? { c: int(obj.input.channels), h: int(obj.input.height), w: int(obj.input.width) } : null;
      spec = new ModelSpec(layers, kind, int(obj.input.dim), int(obj.classes), image,
        obj.loss === undefined ? "cross_entropy" : String(obj.loss));
    } catch (err) {
      if (err instanceof SpecError) throw err;
      throw new SpecError(`malformed model spec: ${err.message}`);
    }
    spec.validate();
    return spec;
  }

  toJson() {
    const input = { kind: this.inputKind, dim: this.inputDim };
    if (this.image) Object.assign(input, { channels: this.image.c, height: this.image.h, width: this.image.w });
    const out = { input, classes: this.classes, layers: this.layers.map((l) => l.toJson()) };
    if (this.loss !== "cross_entropy") out.loss = this.loss;
    return out;
  }

  /** Canonical parameter order: by layer, weight then bias. [[name, shape], ...] */
  paramShapes() {
    return this.layers.flatMap((l, i) => l.paramShapes(i));
  }

  /** The shape the input gives the first layer: {width} or, for an image, {width, c, h, w}. */
  inputShape() {
    if (this.inputKind !== "image") {
      if (this.image) throw new SpecError("only an image input has channels, height and width");
      return { width: this.inputDim };
    }
    if (!this.image) throw new SpecError("an image input needs channels, height and width");
    const { c, h, w } = this.image;
    if (!(c >= 1 && c <= MAX_CHANNELS && h >= 1 && h <= MAX_IMAGE_SIDE && w >= 1 && w <= MAX_IMAGE_SIDE)) {
      throw new SpecError(`an image is 1..${MAX_CHANNELS} channels of 1..${MAX_IMAGE_SIDE} x 1..${MAX_IMAGE_SIDE} pixels, not ${c}x${h}x${w}`);
    }
    if (this.inputDim !== c * h * w) throw new SpecError(`image input dim ${this.inputDim} is not ${c}*${h}*${w}`);
    return { width: this.inputDim, c, h, w };
  }

  validate() {
    const L = this.layers;
    if (!L.length) throw new SpecError("a model needs at least one layer");
    if (!LOSSES.includes(this.loss)) throw new SpecError(`the loss must be one of ${LOSSES.join(", ")}, not '${this.loss}'`);
    if (!INPUT_KINDS.includes(this.inputKind)) {
      throw new SpecError(`input kind must be one of ${INPUT_KINDS.join(", ")}, got '${this.inputKind}'`);
    }
    if (!(this.inputDim >= 1)) throw new SpecError("the input dimension must be >= 1");
    let shape = this.inputShape();
    L.forEach((l, i) => { shape = l.outShape(i, shape, this); });
    if (this.inputKind === "tokens" && !kindOf(L[0]).readsTokens) throw new SpecError("a 'tokens' model must start with an embedding");
    const last = L[L.length - 1];
    if (!kindOf(last).head || last.nOut !== this.classes) throw new SpecError(`the last layer must be linear(.., ${this.classes})`);
    const n = this.paramShapes().reduce((s, [, sh]) => s + sh.reduce((a, b) => a * b, 1), 0);
    if (n > MAX_PARAMS) throw new SpecError(`${n} parameters is more than this engine trains (${MAX_PARAMS})`);
  }
}

/** counters.py unit_counts_per_micro_batch through the registry: {multiply, requantize, relu}
 *  unit invocations of one micro-batch of `microBatch` samples (forward + backward). */
export function layerUnitCounts(spec, microBatch) {
  const out = { multiply: 0, requantize: 0, relu: 0 };
  let rows = microBatch;
  let exp = 0;
  spec.layers.forEach((l, i) => {
    if (kindOf(l).sequence) rows = microBatch * spec.inputDim; // a sequence model: b * T rows after it
    const [m, r, u] = l.units(rows, i, spec.layers);
    out.multiply += m;
    out.requantize += r;
    out.relu += u;
    if (l.expUnits) exp += l.expUnits(microBatch);
  });
  if (readsExp(spec.layers)) out.exp = exp; // only a model that reads the exp unit
  return out;
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

/** settings.py parse_layers: "256,256" -> [256, 256] (the `--layers` / `?layers=` text); an
 *  image model's text also names convolutions and pools: "conv16,pool,conv32k5,pool,64" ->
 *  ["conv16", "pool", "conv32k5", "pool", 64] (see layerItems and imageCnn); a transformer's
 *  names blocks: "block64h4,block64h4" (gpt). */
export function parseLayers(text) {
  const parts = String(text).split(",").map((t) => t.trim());
  if (parts.length > MAX_LAYER_ITEMS) throw new SpecError(`at most ${MAX_LAYER_ITEMS} layers`);
  const items = parts.map((t) => {
    if (/^[0-9]+$/.test(t)) return parseInt(t, 10);
    if (/^[\x00-\x7f]*$/.test(t) && itemStack(t)) return t; // convN, convNkK, pool, blockWhH: checked in full below
    throw new SpecError("--layers takes comma-separated hidden widths such as 256,256 (for images " +
      `convN, convNkK, pool; for text blockWhH transformer blocks), not ${pyRepr(String(text))}`);
  });
  const out = layerItems(items);
  const dense = out.filter((t) => typeof t === "number");
  if (dense.length && dense.length === out.length) return hiddenWidths(dense);
  return out;
}

/** spec.py DEFAULT_CNN: the default layers of an image task. */
export const DEFAULT_CNN = Object.freeze(["conv16", "pool", "conv32", "pool", "conv64", "pool"]);
/** spec.py MAX_LAYER_ITEMS: most items a --layers setting may name. */
export const MAX_LAYER_ITEMS = 32;
/** Python's repr() of a str in the messages Python also writes (ASCII text). */
function pyRepr(t) {
  return t.includes("'") && !t.includes('"') ? `"${t}"` : `'${t.replace(/\\/g, "\\\\").replace(/'/g, "\\'")}'`;
}

/** spec.py MAX_BLOCKS: most transformer blocks a --layers setting may name. */
export const MAX_BLOCKS = 16;

/** spec.py layer_items: check a --layers list of widths and convN, convNkK, pool. */
export function layerItems(items) {
  items = Array.from(items);
  if (items.length < 1 || items.length > MAX_LAYER_ITEMS) {
    throw new SpecError(`--layers names 1 to ${MAX_LAYER_ITEMS} layers, not ${items.length}`);
  }
  const out = items.map((t) => {
    if (typeof t === "number" && Number.isInteger(t)) return t;
    const [kind, m] = itemKind(String(t)); // the kind whose item it is checks it (registry.js)
    if (!kind) {
      throw new SpecError(`unknown --layers item ${pyRepr(String(t))}: use a width (128), convN (3x3), ` +
        "convNkK (KxK, K in 3 or 5), pool, or blockWhH (a transformer block)");
    }
    kind.checkItem(String(t), m);
    return String(t);
  });
  const blocks = out.filter((t) => typeof t === "string" && itemStack(t) === "transformer");
  if (blocks.length && blocks.length !== out.length) {
    throw new SpecError("--layers: a transformer is blockWhH items only (e.g. block64h4,block64h4)");
  }
  if (blocks.length > MAX_BLOCKS) throw new SpecError(`at most ${MAX_BLOCKS} transformer blocks, not ${blocks.length}`);
  const dense = out.filter((t) => typeof t === "number");
  if (dense.length > MAX_HIDDEN_LAYERS) throw new SpecError(`at most ${MAX_HIDDEN_LAYERS} hidden layers, not ${dense.length}`);
  if (dense.some((w) => w < 1)) throw new SpecError(`hidden widths must be >= 1, got ${dense.join(",")}`);
  return out;
}

/**
 * spec.py cnn: an image model from --layers items: each convN / convNkK is conv2d + relu,
 * pool a 2x2 max pool, each width a dense hidden layer + relu (the map is flattened,
 * channel-major, before the first one), then linear(.., classes).
 */
export function imageCnn(c, h, w, items, classes) {
  items = layerItems(items);
  const layers = [];
  let map = { c, h, w };
  let width = c * h * w;
  for (const t of items) {
    if (typeof t === "number") {
      layers.push(new Linear(map ? map.c * map.h * map.w : width, t), new Relu());
      map = null;
      width = t;
      continue;
    }
    if (!map) {
      throw new SpecError(`--layers: ${t} comes after a dense layer; every conv and pool must ` +
        "come before the first dense width");
    }
    const [kind, m] = itemKind(t);
    const made = kind.itemLayers(m, map);
    layers.push(...made.layers);
    map = made.map;
  }
  layers.push(new Linear(map ? map.c * map.h * map.w : width, classes));
  const spec = new ModelSpec(layers, "image", c * h * w, classes, { c, h, w });
  spec.validate();
  return spec;
}

/** spec.py is_transformer: --layers items that name transformer blocks (blockWhH). */
export function isTransformer(items) {
  return items !== null && items !== undefined && typeof items !== "number" &&
    Array.from(items).some((t) => typeof t === "string" && itemStack(t) === "transformer");
}

/** spec.py gpt: a transformer from --layers blockWhH items: embedding(V, W), posembed(T, W),
 *  the blocks (MLP 4W), rmsnorm(W), linear(W, V) applied at every position. */
export function gpt(vocab, context, items) {
  items = layerItems(items);
  const dims = items.map((t) => itemKind(t)[1].slice(1).map(Number));
  const W = dims[0][0];
  if (dims.some(([w]) => w !== W)) {
    throw new SpecError("every block of a transformer has one width (the residual stream's), " +
      `not ${dims.map(([w]) => w).join(",")}`);
  }
  const layers = [new Embedding(vocab, W), new PosEmbed(context, W),
    ...dims.map(([, h]) => new Block(W, h, context, 4 * W)), new RmsNorm(W, context), new Linear(W, vocab)];
  const spec = new ModelSpec(layers, "tokens", context, vocab);
  spec.validate();
  return spec;
}

/** settings.py check_size: a transformer's attention scores of one micro-batch
 *  (b * heads * context^2) within MAX_SCORES, in Python's words. */
export function checkSize(spec, hp) {
  for (const l of spec.layers) if (typeof l.checkSize === "function") l.checkSize(hp.micro_batch);
}

/** data.py Dataset.image_shape: (C, H, W) of an image dataset, from meta.image_shape. */
export function imageShape(ds) {
  const sh = ds.meta && ds.meta.image_shape;
  if (!Array.isArray(sh) || sh.length !== 3 || !sh.every(Number.isInteger)) {
    throw new SpecError("an image dataset names its [channels, height, width] in meta.image_shape");
  }
  return sh;
}

/** spec.py hidden_of: the hidden widths (out-features of every linear but the last) of a
 *  ModelSpec or of its JSON (`{layers: [{type: "linear", out}, ...]}`). */
export function hiddenOf(spec) {
  return spec.layers.filter((l) => kindOf(l)?.head).map((l) => l.nOut ?? l.out).slice(0, -1);
}

/** spec.py layers_text: the --layers text that makes this spec (its convs, pools and hidden
 *  widths in order: "conv16,pool,conv32k5,pool,64"), of a ModelSpec or of its JSON. */
export function layersText(spec) {
  return describeLayers(spec.layers).join(","); // each kind describes itself (registry.js)
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
 *  `--hidden`), the --layers items (widths, and for an image task convN / convNkK / pool), or
 *  null for the task's default (one hidden layer of 128; an image task: DEFAULT_CNN). */
export function modelFor(ds, layers = null, dim = 16) {
  const spec = modelForLayers(ds, layers, dim);
  const loss = (ds.meta && ds.meta.loss) || "cross_entropy"; // a task of your own (task.py)
  if (loss === spec.loss) return spec;
  spec.loss = loss;
  spec.validate();
  return spec;
}

function modelForLayers(ds, layers, dim) {
  if (typeof layers === "number" && layers < 1) throw new SpecError("--hidden must be >= 1");
  if (ds.kind === "image") {
    const items = layers === null || layers === undefined ? DEFAULT_CNN : typeof layers === "number" ? [layers] : layers;
    const [c, h, w] = imageShape(ds);
    return imageCnn(c, h, w, items, ds.classes);
  }
  layers = layers ?? 128;
  if (isTransformer(layers)) {
    if (ds.kind !== "tokens") throw new SpecError(`transformer blocks read a text (--task text), not the ${ds.task} task`);
    return gpt(ds.classes, ds.x_train.shape[1], layers);
  }
  if (typeof layers !== "number" && Array.from(layers).some((t) => typeof t === "string")) {
    throw new SpecError(`conv and pool layers need an image input (--task image); the ${ds.task} task takes dense widths only`);
  }
  if (ds.kind === "dense") return mlp(ds.x_train.shape[1], layers, ds.classes);
  return charMlp(ds.classes, ds.x_train.shape[1], dim, layers);
}

/** Hyper, with the same field names and defaults as spec.py (snake_case, as on the wire). */
export const HYPER_DEFAULTS = Object.freeze({
  lr: 3e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0,
  batch: 64, micro_batch: 16, grad_frac_bits: 40, seed: 0,
  augment_shift: 0, lr_warmup: 0, lr_decay_steps: 0,
  replicas: 1, sync_every: 1, outer_lr: 1, outer_momentum: 0.5, moments_every: 8,
});
/** spec.py MOMENTS_EVERY: the default K, left out of the identity JSON. */
export const MOMENTS_EVERY = 8;
/** Hyper fields that are floats in Python (their canonical JSON spelling differs from ints). */
export const HYPER_FLOATS = ["lr", "beta1", "beta2", "eps", "weight_decay", "outer_lr", "outer_momentum"];
/** spec.py LOCAL_FIELDS: local steps (engine/local.js), all in the JSON of a local-steps run,
 *  none in a synchronous one's (R == H == 1 keeps the identity it always had). */
export const LOCAL_FIELDS = ["replicas", "sync_every", "outer_lr", "outer_momentum", "moments_every"];
/** spec.py Hyper.local: more than one replica or inner step a round. */
export const isLocal = (hp) => hp.replicas !== 1 || hp.sync_every !== 1;
/** spec.py RECIPE_FIELDS: the image recipe's fields, left out of the JSON when 0 (so that a
 *  run without them keeps its identity). */
export const RECIPE_FIELDS = ["augment_shift", "lr_warmup", "lr_decay_steps"];

/** The image task's recipe defaults (task_defaults.json, the table every command reads). */
export const IMAGE_RECIPE = Object.freeze({ augment_shift: TASK_DEFAULTS.image.augment_shift, lr_warmup: TASK_DEFAULTS.image.lr_warmup });

/** settings.py settings_from_args's recipe fields for a run of `steps` steps of `task`:
 *  each of `given` (null or absent: not set) else the task's default (task_defaults.js). */
export function recipeSettings(task, steps, given = {}) {
  const image = task === "image";
  const d = taskDefaults(TASK_DEFAULTS[task] ? task : "digits", steps);
  const pick = (k) => (given[k] === null || given[k] === undefined ? d[k] : given[k]);
  const out = { augment_shift: pick("augment_shift"), lr_warmup: pick("lr_warmup"), lr_decay_steps: pick("lr_decay_steps") };
  if (!image && out.augment_shift) throw new SpecError("--augment-shift and --image-size apply to the image task");
  return out;
}

export function makeHyper(overrides = {}) {
  const hp = { ...HYPER_DEFAULTS, ...overrides };
  for (const k of Object.keys(hp)) {
    if (!(k in HYPER_DEFAULTS)) throw new SpecError(`unknown hyperparameter ${k}`);
  }
  for (const k of [...RECIPE_FIELDS, "replicas", "sync_every", "moments_every"]) {
    if (!Number.isInteger(hp[k])) throw new SpecError(`${k} must be an integer, got ${JSON.stringify(hp[k])}`);
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
  if (!(hp.augment_shift >= 0 && hp.augment_shift <= 8)) throw new SpecError("--augment-shift must lie in [0, 8] pixels");
  if (!(hp.lr_warmup >= 0 && hp.lr_warmup <= 2 ** 31 && hp.lr_decay_steps >= 0 && hp.lr_decay_steps <= 2 ** 31)) {
    throw new SpecError("--lr-warmup and --lr-decay-steps must lie in [0, 2**31]");
  }
  if (hp.lr_decay_steps && hp.lr_warmup >= hp.lr_decay_steps) {
    throw new SpecError(`--lr-warmup (${hp.lr_warmup}) must be below --lr-decay-steps (${hp.lr_decay_steps})`);
  }
  if (!(hp.replicas >= 1 && hp.replicas <= 1024)) throw new SpecError("--replicas must lie in [1, 1024]");
  if (!(hp.sync_every >= 1 && hp.sync_every <= 100000)) throw new SpecError("--sync-every must lie in [1, 100000]");
  if (!(typeof hp.outer_lr === "number" && hp.outer_lr > 0 && hp.outer_lr <= 4)) {
    throw new SpecError("--outer-lr must be a finite number in (0, 4]");
  }
  if (!(typeof hp.outer_momentum === "number" && hp.outer_momentum >= 0 && hp.outer_momentum < 1)) {
    throw new SpecError("--outer-momentum must be a finite number in [0, 1)");
  }
  if (!(hp.moments_every >= 1 && hp.moments_every <= 1024)) throw new SpecError("--moments-every must lie in [1, 1024]");
  return Object.freeze(hp);
}

/** spec.py Hyper.to_json: every field, but the recipe's only when set. */
export function hyperJson(hp) {
  const out = { ...hp };
  for (const k of RECIPE_FIELDS) if (!out[k]) delete out[k];
  if (!isLocal(hp)) for (const k of LOCAL_FIELDS) delete out[k];
  if (out.moments_every === MOMENTS_EVERY) delete out.moments_every; // the default K keeps the run id
  return out;
}

export const nMicro = (hp) => hp.batch / hp.micro_batch;

// Model specs and hyperparameters, mirroring daisychain/engine/spec.py: the same JSON, the
// same validation, the same canonical parameter order.

import { Conv2d, int, layerFromJson, Linear, MAX_FEATURES, MaxPool2d, Relu, SpecError } from "./layers.js";

export const MAX_PARAMS = 50_000_000;
export const INPUT_KINDS = ["dense", "tokens", "image"];

export { MAX_FEATURES, SpecError };

/** Layers are the classes of layers.js (Linear, Embedding, Relu, Conv2d, MaxPool2d); an
 *  image input is {kind: "image", dim: C*H*W, channels: C, height: H, width: W}. */
export class ModelSpec {
  constructor(layers, inputKind, inputDim, classes, image = null) {
    this.layers = layers.map((l) => (typeof l.forward === "function" ? l : layerFromJson(legacyJson(l))));
    this.inputKind = inputKind;
    this.inputDim = inputDim;
    this.classes = classes;
    this.image = image; // {c, h, w} of an image input
  }

  static fromJson(obj) {
    let spec;
    try {
      const layers = obj.layers.map(layerFromJson);
      const kind = String(obj.input.kind);
      const image = kind === "image" && obj.input.channels !== undefined
        ? { c: int(obj.input.channels), h: int(obj.input.height), w: int(obj.input.width) } : null;
      spec = new ModelSpec(layers, kind, int(obj.input.dim), int(obj.classes), image);
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
    return { input, classes: this.classes, layers: this.layers.map((l) => l.toJson()) };
  }

  /** Canonical parameter order: by layer, weight then bias. [[name, shape], ...] */
  paramShapes() {
    return this.layers.flatMap((l, i) => l.paramShapes(i));
  }

  /** The shape the input gives the first layer: {width} or, for an image, {width, c, h, w}. */
  inputShape() {
    if (this.inputKind !== "image") return { width: this.inputDim };
    let img = this.image;
    if (!img) { // the geometry of an image input without one is the first conv / pool's
      const l = this.layers[0];
      if (l.type === "conv2d") img = { c: l.ci, h: l.h, w: l.w };
      else if (l.type === "maxpool2d") img = { c: l.c, h: l.h, w: l.w };
      else return { width: this.inputDim };
    }
    if (!(img.c >= 1 && img.h >= 1 && img.w >= 1) || img.c * img.h * img.w !== this.inputDim) {
      throw new SpecError(`an image input of ${img.c}x${img.h}x${img.w} does not have ${this.inputDim} values`);
    }
    return { width: this.inputDim, ...img };
  }

  validate() {
    const L = this.layers;
    if (!L.length) throw new SpecError("a model needs at least one layer");
    if (!INPUT_KINDS.includes(this.inputKind)) {
      throw new SpecError(`input kind must be 'dense', 'tokens' or 'image', got '${this.inputKind}'`);
    }
    if (!(this.inputDim >= 1)) throw new SpecError("the input dimension must be >= 1");
    let shape = this.inputShape();
    L.forEach((l, i) => { shape = l.outShape(i, shape, this); });
    if (this.inputKind === "tokens" && L[0].type !== "embedding") throw new SpecError("a 'tokens' model must start with an embedding");
    const last = L[L.length - 1];
    if (last.type !== "linear" || last.nOut !== this.classes) throw new SpecError(`the last layer must be linear(.., ${this.classes})`);
    const n = this.paramShapes().reduce((s, [, sh]) => s + sh.reduce((a, b) => a * b, 1), 0);
    if (n > MAX_PARAMS) throw new SpecError(`${n} parameters is more than this engine trains (${MAX_PARAMS})`);
  }
}

/** {type, nIn, nOut} (the form older code builds) -> the layer's spec JSON. */
function legacyJson(l) {
  if (l.type === "linear") return { type: "linear", in: l.nIn, out: l.nOut };
  if (l.type === "embedding") return { type: "embedding", vocab: l.nIn, dim: l.nOut };
  return l;
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

/** settings.py parse_layers: "256,256" -> [256, 256] (the `--layers` / `?layers=` text). An
 *  image model's text also names convolutions and pools: "conv16,pool,conv32k5,pool,128" ->
 *  ["conv16", "pool", "conv32k5", "pool", 128] (conv<N> = N filters 3x3, conv<N>k<K> = K x K,
 *  pool = 2x2 max pool, an integer = a dense hidden layer; see imageCnn). */
export function parseLayers(text) {
  const parts = String(text).split(",").map((t) => t.trim());
  if (parts.length > MAX_HIDDEN_LAYERS) throw new SpecError(`at most ${MAX_HIDDEN_LAYERS} hidden layers`);
  if (parts.some((t) => CONV_ITEM.test(t) || t === "pool")) {
    return parts.map((t) => {
      if (/^[+-]?[0-9]+$/.test(t)) return hiddenWidths([parseInt(t, 10)])[0];
      const m = CONV_ITEM.exec(t);
      if (m) return m[2] === undefined || m[2] === "3" ? `conv${+m[1]}` : `conv${+m[1]}k${+m[2]}`;
      if (t === "pool") return t;
      throw new SpecError(`--layers takes comma-separated hidden widths such as 256,256 (or conv16,conv16k5,pool,128 ` +
        `for images), not ${JSON.stringify(String(text))}`);
    });
  }
  if (!parts.every((t) => /^[+-]?[0-9]+$/.test(t))) {
    throw new SpecError(`--layers takes comma-separated hidden widths such as 256,256, not ${JSON.stringify(String(text))}`);
  }
  return hiddenWidths(parts.map((t) => parseInt(t, 10)));
}

const CONV_ITEM = /^conv([0-9]+)(?:k([0-9]+))?$/;

/** The default layers of an image model (spec.py decides; this mirrors it). */
export const IMAGE_LAYERS_DEFAULT = ["conv16", "pool", "conv32", "pool", 64];

/**
 * A CNN on a C x H x W image: conv items become conv2d + relu, pool a maxpool2d, integers a
 * linear + relu (flattening channel-major at the first), then linear(.., classes).
 */
export function imageCnn(c, h, w, items, classes) {
  if (!Array.isArray(items) || !items.length) throw new SpecError("an image model needs a list of layers");
  const layers = [];
  let shape = { c, h, w };
  let width = c * h * w;
  items.forEach((it) => {
    if (typeof it === "number") {
      hiddenWidths([it]);
      layers.push(new Linear(width, it), new Relu());
      width = it;
      shape = null;
      return;
    }
    const m = CONV_ITEM.exec(String(it));
    if (!shape) throw new SpecError(`--layers: ${it} comes after a dense layer; convolutions and pools come first`);
    if (m) {
      const co = +m[1];
      const k = m[2] === undefined ? 3 : +m[2];
      if (co < 1) throw new SpecError(`--layers: ${it} needs at least one filter`);
      layers.push(new Conv2d(shape.c, co, k, shape.h, shape.w), new Relu());
      shape = { c: co, h: shape.h, w: shape.w };
    } else if (it === "pool") {
      if (shape.h < 2 || shape.w < 2) throw new SpecError(`--layers: a pool on a ${shape.h}x${shape.w} map (it needs 2x2 at least)`);
      layers.push(new MaxPool2d(shape.c, shape.h, shape.w));
      shape = { c: shape.c, h: shape.h >> 1, w: shape.w >> 1 };
    } else {
      throw new SpecError(`--layers: unknown item ${JSON.stringify(it)}`);
    }
    width = shape.c * shape.h * shape.w;
  });
  layers.push(new Linear(width, classes));
  const spec = new ModelSpec(layers, "image", c * h * w, classes, { c, h, w });
  spec.validate();
  return spec;
}

/** (C, H, W) of an image dataset: its x_train shape (N, C, H, W), or meta.channels/height/width. */
export function imageShape(ds) {
  const sh = ds.x_train.shape;
  if (sh.length === 4) return [sh[1], sh[2], sh[3]];
  const m = ds.meta || {};
  if (sh.length === 3) return [m.channels ?? 1, sh[1], sh[2]];
  return [m.channels, m.height, m.width];
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
  if (ds.kind === "image") {
    const [c, h, w] = imageShape(ds);
    return imageCnn(c, h, w, typeof layers === "number" && layers === 128 ? IMAGE_LAYERS_DEFAULT
      : typeof layers === "number" ? [layers] : layers, ds.classes);
  }
  if (Array.isArray(layers) && layers.some((it) => typeof it !== "number")) {
    throw new SpecError("conv and pool layers need an image input (--task image)");
  }
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
  if (!(hp.lr > 0 && hp.beta1 >= 0 && hp.beta1 < 1 && hp.beta2 >= 0 && hp.beta2 < 1 && hp.eps > 0 && hp.weight_decay >= 0)) {
    throw new SpecError("lr and eps must be > 0, betas in [0, 1), weight decay >= 0");
  }
  if (!Number.isInteger(hp.seed) || hp.seed < 0 || hp.seed > 0xffffffff) throw new SpecError("--seed must be an integer in [0, 2**32 - 1]");
  if (!(Number.isInteger(hp.grad_frac_bits) && hp.grad_frac_bits >= 0 && hp.grad_frac_bits <= 60)) {
    throw new SpecError("grad_frac_bits must lie in [0, 60]");
  }
  return Object.freeze(hp);
}

export const nMicro = (hp) => hp.batch / hp.micro_batch;

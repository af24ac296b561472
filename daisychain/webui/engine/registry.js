// The layer registry of the JS engine (engine/layers.py LAYERS + attention.py KINDS): every
// layer type by its JSON `type`, the dense and image kinds of layers.js and the transformer's
// of transformer.js.

import { Conv2d, Embedding, Linear, MaxPool2d, Relu, SpecError } from "./layers.js";
import { Block, PosEmbed, RmsNorm } from "./transformer.js";

export const LAYER_TYPES = {
  linear: Linear, embedding: Embedding, relu: Relu, conv2d: Conv2d, maxpool2d: MaxPool2d,
  posembed: PosEmbed, block: Block, rmsnorm: RmsNorm,
};

/** A layer object from its spec JSON; SpecError for an unknown type or a bad field. */
export function layerFromJson(l) {
  const cls = Object.prototype.hasOwnProperty.call(LAYER_TYPES, l?.type) ? LAYER_TYPES[l.type] : null;
  if (!cls) throw new SpecError(`unknown layer type ${JSON.stringify(l?.type)}`);
  return cls.fromJson(l);
}

/** The kind (class) of a layer or of its spec JSON, or null for an unknown type. Code outside
 *  the registry asks the kind (head, folds, readsTokens, sequence, describe, ...), never the type. */
export function kindOf(l) {
  return Object.prototype.hasOwnProperty.call(LAYER_TYPES, l?.type) ? LAYER_TYPES[l.type] : null;
}

/** The kinds that have a --layers item (conv, pool, block; a dense width is a number). */
const ITEM_KINDS = Object.values(LAYER_TYPES).filter((k) => k.item);

/** [kind, match] of the --layers item `t`, or [null, null] (spec.py item_kind). */
export function itemKind(t) {
  for (const k of ITEM_KINDS) {
    const m = k.item.exec(t);
    if (m) return [k, m];
  }
  return [null, null];
}

/** The model family ("image", "transformer") that the text `t` means an item of, or "". */
export function itemStack(t) {
  const k = ITEM_KINDS.find((kind) => kind.looksLike(t));
  return k ? k.stack : "";
}

/** A sequence model: a kind in it makes every layer after it see b * context rows. */
export function isSequence(layers) {
  return layers.some((l) => kindOf(l)?.sequence === true);
}

/** Its forward reads the exp unit (an attention block's softmax). */
export function readsExp(layers) {
  return layers.some((l) => typeof l.expUnits === "function" && l.expUnits(1) > 0);
}

/** The --layers items that describe these layers (of a ModelSpec or of its JSON). */
export function describeLayers(layers) {
  const J = layers.map((l) => (typeof l.toJson === "function" ? l.toJson() : l));
  return J.map((j, i) => kindOf(j)?.describe?.(j, i, J) ?? null).filter((t) => t !== null);
}

/** {type, nIn, nOut} (the form older code builds) -> the layer's spec JSON. */
export function legacyJson(l) {
  if (l.type === "linear") return { type: "linear", in: l.nIn, out: l.nOut };
  if (l.type === "embedding") return { type: "embedding", vocab: l.nIn, dim: l.nOut };
  return l;
}

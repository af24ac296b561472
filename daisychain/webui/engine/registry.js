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

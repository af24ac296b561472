"""``daisychain sample RUN.pt --prompt "..."``: text from a trained text model.

    daisychain train --task text --steps 2000 --save-checkpoint zen.pt
    daisychain sample zen.pt --prompt "Beautiful is" --length 200

The checkpoint is read with the checked loader (as ``export`` does); its vocabulary (saved in
every text checkpoint; for an older checkpoint of the embedded text, that text's) maps the
model's classes to characters. Each next character is drawn from the INT8 engine's own
forward pass (the logits divided by ``--temperature``, the engine's softmax; 0: always the
most likely) with a seeded generator, so the same command prints the same text. A prompt
shorter than the model's context is padded on the left with a space (or the vocabulary's
first character when it has no space).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from daisychain.engine.settings import setting_type


class SampleError(ValueError):
    """A checkpoint or prompt that cannot be sampled from, in words."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="RUN.pt", help="a checkpoint of a text run")
    p.add_argument("--prompt", default="", help="text to go on from (default: none)")
    p.add_argument("--length", type=setting_type("length"), default=200,
                   help="characters to generate (default 200)")
    p.add_argument("--temperature", type=setting_type("temperature"), default=0.8,
                   help="divides the logits; 0: always the most likely character (default 0.8)")
    p.add_argument("--seed", type=setting_type("seed"), default=0, help="sampling seed (default 0)")


def load(path):
    """(Engine, theta, spec, vocab) of a text checkpoint; raises SampleError."""
    from daisychain.engine.checkpoint import CheckpointError, read_checkpoint_file
    from daisychain.engine.model import Engine
    from daisychain.engine.spec import ModelSpec
    from daisychain.export import _vocab
    from daisychain.units import load_luts

    try:
        ck = read_checkpoint_file(path)
    except CheckpointError as exc:
        raise SampleError(str(exc)) from None
    spec = ModelSpec.from_json(ck.identity["model"])
    if spec.input_kind != "tokens":
        raise SampleError(f"{path}: a {ck.identity.get('task')} model, not a text model")
    vocab = ck.vocab or _vocab(ck.identity)
    if vocab is None:
        raise SampleError(f"{path}: the checkpoint has no vocabulary (it was saved before "
                          f"checkpoints carried one); save it again with this version")
    return Engine(spec, load_luts()), ck.theta, spec, vocab


def generate(engine, theta, spec, vocab: str, prompt: str, length: int, temperature: float,
             seed: int) -> str:
    missing = sorted(set(prompt) - set(vocab))
    if missing:
        raise SampleError(f"the prompt has characters the model never saw: {''.join(missing)!r}")
    index = {c: i for i, c in enumerate(vocab)}
    pad = index.get(" ", 0)
    ctx = spec.input_dim
    ids = [pad] * max(0, ctx - len(prompt)) + [index[c] for c in prompt]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(length):
        x = np.array(ids[-ctx:], np.int32)[None, None, :]
        z, _ = engine.forward(theta, x)
        z = z[0, 0]
        if temperature == 0:
            nxt = int(z.argmax())
        else:
            p = engine.softmax(z / temperature)
            nxt = int(rng.choice(len(p), p=p / p.sum()))
        ids.append(nxt)
        out.append(vocab[nxt])
    return "".join(out)


def run(args: argparse.Namespace) -> int:
    try:
        engine, theta, spec, vocab = load(args.checkpoint)
        text = generate(engine, theta, spec, vocab, args.prompt, args.length, args.temperature,
                        args.seed)
    except SampleError as exc:
        print(f"daisychain sample: error: {exc}", file=sys.stderr)
        return 2
    print(args.prompt + text)
    return 0

"""``daisychain sample RUN.pt --prompt "..."``: text from a trained text model.

    daisychain train --task text --steps 2000 --save-checkpoint zen.pt
    daisychain sample zen.pt --prompt "Beautiful is" --length 200

The checkpoint is read with the checked loader (as ``export`` does); its vocabulary (saved in
every text checkpoint; for an older checkpoint of the embedded text, that text's) maps the
model's classes to characters. Each next character is drawn from the INT8 engine's own
forward pass (the logits divided by ``--temperature``, the engine's softmax; 0: always the
most likely) with a seeded generator, so the same command prints the same text. It goes on
past ``--length`` to the end of the word it reached (at most 40 more characters) and says
on stderr how many characters it wrote and how it ended. A prompt
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


#: a word ends at one of these: ``--length`` goes on to the end of the word it reached, by at
#: most FINISH_MAX more characters (then it says it stopped mid-word)
WORD_END = frozenset(" \n\t.,;:!?")
FINISH_MAX = 40


def generate(engine, theta, spec, vocab: str, prompt: str, length: int, temperature: float,
             seed: int, finish: int = 0) -> str:
    """``length`` characters, then up to ``finish`` more until one ends a word (WORD_END)."""
    missing = sorted(set(prompt) - set(vocab))
    if missing:
        raise SampleError(f"the prompt has characters the model never saw: {''.join(missing)!r}")
    index = {c: i for i, c in enumerate(vocab)}
    pad = index.get(" ", 0)
    ctx = spec.input_dim
    ids = [pad] * max(0, ctx - len(prompt)) + [index[c] for c in prompt]
    rng = np.random.default_rng(seed)
    out = []
    for k in range(length + finish):
        if k >= length and (not out or out[-1] in WORD_END):
            break
        x = np.array(ids[-ctx:], np.int32)[None, None, :]
        z, _ = engine.forward(theta, x)
        z = engine.last_logits(z)[0, 0]  # a sequence model: the last position
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
                        args.seed, finish=FINISH_MAX)
    except SampleError as exc:
        print(f"daisychain sample: error: {exc}", file=sys.stderr)
        return 2
    print(args.prompt + text.rstrip(" \t"))
    print(f"daisychain sample: wrote {len(text)} characters after the prompt "
          f"(--length {args.length}, {_ending(text, args.length)})", file=sys.stderr)
    return 0


def _ending(text: str, length: int) -> str:
    if not text or text[-1] in WORD_END:
        return "then to the end of the word" if len(text) > length else "ending a word"
    return f"stopped mid-word: no word end in {FINISH_MAX} more characters"

"""The run settings flags shared by ``daisychain train``, ``daisy-peer`` and ``daisychain
demo``: same names, same defaults, validated once into (task data, model spec, Hyper)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from daisychain.engine.data import TASKS, DataError, Dataset, model_for, prepare_task
from daisychain.engine.spec import (MAX_CAPACITY, MAX_LAYER_ITEMS, MIN_CAPACITY, Hyper, ModelSpec, SpecError,
                                    hidden_widths, layer_items)

DEFAULT_STEPS = 600


def add_run_arguments(p: argparse.ArgumentParser, steps: int = DEFAULT_STEPS) -> None:
    d = Hyper()
    g = p.add_argument_group("run settings")
    g.add_argument("--task", default="digits", help=f"one of {', '.join(TASKS)} (default digits)")
    g.add_argument("--data", default=None,
                   help="text task: a local .txt/.csv/.json/.parquet file or a cached HF dataset "
                        "(default: the embedded Zen of Python)")
    g.add_argument("--column", default="text", help="text column of --data (default text)")
    g.add_argument("--context", type=int, default=8, help="text task: context window (default 8)")
    g.add_argument("--steps", type=int, default=steps, help=f"optimizer steps (default {steps})")
    g.add_argument("--seed", type=int, default=d.seed, help="run seed (default 0)")
    g.add_argument("--batch", type=int, default=d.batch, help=f"global batch (default {d.batch})")
    g.add_argument("--micro-batch", type=int, default=d.micro_batch,
                   help=f"samples per micro-batch (default {d.micro_batch})")
    g.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr})")
    g.add_argument("--weight-decay", type=float, default=d.weight_decay,
                   help="decoupled weight decay (default 0)")
    g.add_argument("--hidden", type=int, default=None,
                   help="hidden units of the one hidden layer (default 128); see --layers")
    g.add_argument("--layers", type=parse_layers, default=None, metavar="W1,W2,...",
                   help="hidden widths, comma-separated, e.g. 256,256 for two hidden layers of "
                        "256 (default: one hidden layer of --hidden); image task: convN (N 3x3 "
                        "filters), convNkK (KxK), pool (2x2 max), then widths, e.g. "
                        "conv16,pool,conv32,pool,128; not together with --hidden")
    g.add_argument("--embed-dim", type=int, default=16, help="text task: embedding size (default 16)")


def parse_layers(text: str) -> tuple[int | str, ...]:
    """``"256,256"`` -> ``(256, 256)``; ``"conv16,pool,conv32k5,pool,64"`` -> ``("conv16",
    "pool", "conv32k5", "pool", 64)``; argparse turns the SpecError into a usage error."""
    parts = [t.strip() for t in str(text).split(",")]
    if len(parts) > MAX_LAYER_ITEMS:
        raise argparse.ArgumentTypeError(f"at most {MAX_LAYER_ITEMS} layers")
    items = []
    for t in parts:
        if t.isdigit() and t.isascii():
            items.append(int(t, 10))
        elif t == "pool" or (t.startswith("conv") and t.isascii()):
            items.append(t)
        else:
            raise argparse.ArgumentTypeError(
                f"--layers takes comma-separated hidden widths such as 256,256 (and for images "
                f"convN, convNkK, pool), not {text!r}")
    try:
        items = layer_items(items)
        dense = [w for w in items if isinstance(w, int)]
        if dense and len(dense) == len(items):
            hidden_widths(dense)
        return items
    except SpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def hidden_setting(args: argparse.Namespace):
    """The layers the flags ask for: --layers, else --hidden, else None (the task's default:
    one hidden layer of 128, or spec.DEFAULT_CNN for an image task)."""
    layers = getattr(args, "layers", None)
    hidden = getattr(args, "hidden", None)
    if layers is not None and hidden is not None:
        raise SpecError("give --layers or --hidden, not both (--hidden N is --layers N)")
    if layers is not None:
        return tuple(layers)
    return hidden


@dataclass
class RunSettings:
    ds: Dataset
    spec: ModelSpec
    hp: Hyper
    steps: int


def settings_from_args(args: argparse.Namespace) -> RunSettings:
    """Raises SpecError/DataError with a message for the user."""
    if args.steps < 0:
        raise SpecError("--steps must be >= 0")
    hp = Hyper(lr=args.lr, weight_decay=args.weight_decay, batch=args.batch,
               micro_batch=args.micro_batch, seed=args.seed)
    hp.validate()
    ds = prepare_task(args.task, args.data, args.column, args.context)
    spec = model_for(ds, hidden_setting(args), args.embed_dim)
    return RunSettings(ds, spec, hp, args.steps)


USER_ERRORS = (SpecError, DataError)


def capacity_arg(v: str) -> float | None:
    """``--capacity auto|N`` for daisy-peer and daisychain cluster: None (measure) or a finite
    number of micro-batches per second in [MIN_CAPACITY, MAX_CAPACITY]."""
    if v == "auto":
        return None
    try:
        c = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError("--capacity is 'auto' or micro-batches per second") from None
    if not (math.isfinite(c) and MIN_CAPACITY <= c <= MAX_CAPACITY):
        raise argparse.ArgumentTypeError(f"--capacity must be a finite number in "
                                         f"[{MIN_CAPACITY:g}, {MAX_CAPACITY:g}]")
    return c

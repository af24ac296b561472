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
#: the image task's defaults (docs/DATA.md, "The recipe"): with them ``daisychain train --task
#: image`` reaches the accuracy docs/BENCHMARKS.md reports; lr_decay_steps defaults to --steps
IMAGE_DEFAULTS = {"steps": 3000, "lr": 6e-3, "augment_shift": 2, "lr_warmup": 100}  # warm-up at most --steps / 10


def add_run_arguments(p: argparse.ArgumentParser, steps: int = DEFAULT_STEPS) -> None:
    d = Hyper()
    g = p.add_argument_group("run settings")
    g.add_argument("--task", default="digits", help=f"one of {', '.join(TASKS)} (default digits)")
    g.add_argument("--data", default=None,
                   help="text task: a local .txt/.csv/.json/.parquet file or a cached HF dataset "
                        "(default: the embedded Zen of Python); image task: a Keras .npz, a "
                        "folder of class subfolders, an HF image .parquet/.arrow file or an HF "
                        "dataset name (default: the embedded MNIST digits)")
    g.add_argument("--image-size", type=int, default=None, metavar="N",
                   help="image task: resize every image to N x N (default: keep the size)")
    g.add_argument("--column", default="text", help="text column of --data (default text)")
    g.add_argument("--context", type=int, default=8, help="text task: context window (default 8)")
    g.add_argument("--steps", type=int, default=None,
                   help=f"optimizer steps (default {steps}; image task {IMAGE_DEFAULTS['steps']})")
    p.set_defaults(_default_steps=steps)
    g.add_argument("--seed", type=int, default=d.seed, help="run seed (default 0)")
    g.add_argument("--batch", type=int, default=d.batch, help=f"global batch (default {d.batch})")
    g.add_argument("--micro-batch", type=int, default=d.micro_batch,
                   help=f"samples per micro-batch (default {d.micro_batch})")
    g.add_argument("--lr", type=float, default=None,
                   help=f"Adam learning rate (default {d.lr}; image task {IMAGE_DEFAULTS['lr']})")
    g.add_argument("--augment-shift", type=int, default=None, metavar="PX",
                   help="image task: shift each training image by up to PX pixels, drawn from the "
                        f"seed (default {IMAGE_DEFAULTS['augment_shift']}; 0 = off)")
    g.add_argument("--lr-warmup", type=int, default=None, metavar="STEPS",
                   help="linear learning-rate warm-up steps (default 0; image task "
                        f"{IMAGE_DEFAULTS['lr_warmup']}, at most --steps / 10)")
    g.add_argument("--lr-decay-steps", type=int, default=None, metavar="STEPS",
                   help="linear learning-rate decay to 0 at this step (default 0 = constant; "
                        "image task: --steps)")
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
    image = args.task == "image"
    task_default = IMAGE_DEFAULTS if image else {}
    if getattr(args, "steps", None) is None:
        args.steps = task_default.get("steps", getattr(args, "_default_steps", DEFAULT_STEPS))
    if args.steps < 0:
        raise SpecError("--steps must be >= 0")

    def pick(name: str, default):
        v = getattr(args, name, None)
        return task_default.get(name, default) if v is None else v

    if not image and (pick("augment_shift", 0) or getattr(args, "image_size", None) is not None):
        raise SpecError("--augment-shift and --image-size apply to the image task")
    hp = Hyper(lr=pick("lr", Hyper.lr), weight_decay=args.weight_decay, batch=args.batch,
               micro_batch=args.micro_batch, seed=args.seed,
               augment_shift=pick("augment_shift", 0),
               lr_warmup=pick("lr_warmup", 0) if getattr(args, "lr_warmup", None) is not None or not image
               else min(IMAGE_DEFAULTS["lr_warmup"], args.steps // 10),
               lr_decay_steps=pick("lr_decay_steps", args.steps if image else 0))
    hp.validate()
    ds = prepare_task(args.task, args.data, args.column, args.context,
                      image_size=getattr(args, "image_size", None))
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

"""The run settings flags shared by ``daisychain train``, ``daisy-peer``, ``daisychain demo``
and ``daisychain cluster``: same names, same defaults, validated once into (task data, model
spec, Hyper).

:data:`SETTINGS` is the one table of every number a command takes, with the range in which
the run's arithmetic stays exact (finite; a learning rate above 1 or a decay above 1 drives
the parameters past what the INT8 quantization and the float64 Adam hold). A value is
checked against it when the flag is parsed (:func:`setting_type`) and again in
:func:`settings_from_args` (for a Namespace built by code). The page checks its fields with
the same table (``webui/engine/settings_check.js``); ``tests/data/settings_values.json`` holds
the two together: the same raw text gets the same reason in both languages.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

from daisychain.engine.data import TASKS, DataError, Dataset, model_for, prepare_task
from daisychain.engine.task_defaults import TASK_DEFAULTS, defaults
from daisychain.engine.layers import item_stack, kind_of
from daisychain.engine.spec import (MAX_CAPACITY, MAX_FEATURES, MAX_HIDDEN_LAYERS, MAX_LAYER_ITEMS, MAX_LR,
                                    MAX_MOMENTS_EVERY, MAX_OUTER_LR, MAX_REPLICAS, MAX_STEPS, MAX_SYNC_EVERY,
                                    MAX_WEIGHT_DECAY,
                                    MIN_CAPACITY, Hyper, ModelSpec, SpecError, hidden_widths, layer_items)

#: each task's defaults come from the one table (engine/task_defaults.json, which the page and
#: /selftest read too); the image task's (docs/DATA.md, "The recipe") reach the accuracy
#: docs/BENCHMARKS.md reports; its lr_decay_steps is --steps, its warm-up at most --steps / 10
DEFAULT_STEPS = TASK_DEFAULTS["digits"]["steps"]
IMAGE_DEFAULTS = TASK_DEFAULTS["image"]


@dataclass(frozen=True)
class Range:
    """A whole number (``kind="int"``) or a finite decimal number (``"float"``) in [lo, hi]
    (``(lo, hi]`` when ``lo_open``)."""

    kind: str
    lo: float
    hi: float
    lo_open: bool = False

    @property
    def text(self) -> str:
        what = "a whole number" if self.kind == "int" else "a finite number"
        lo = str(int(self.lo)) if self.kind == "int" else f"{self.lo:g}"
        hi = str(int(self.hi)) if self.kind == "int" else f"{self.hi:g}"
        return f"must be {what} in {'(' if self.lo_open else '['}{lo}, {hi}]"

    def holds(self, v) -> bool:
        if self.kind == "int" and (isinstance(v, bool) or not isinstance(v, int)):
            return False
        if self.kind == "float" and (isinstance(v, bool) or not isinstance(v, (int, float))
                                     or not math.isfinite(v)):
            return False
        return (self.lo < v if self.lo_open else self.lo <= v) and v <= self.hi


#: every number a command takes (flag name with "_"), and its range; the page's fields are
#: the subset PAGE_SETTINGS, checked by webui/engine/settings_check.js with the same ranges (its
#: settings_table.js is generated from this table: python -m daisychain.engine.js_tables)
SETTINGS: dict[str, Range] = {
    "steps": Range("int", 1, MAX_STEPS),
    "seed": Range("int", 0, 0xFFFFFFFF),
    "batch": Range("int", 1, 65536),
    "micro_batch": Range("int", 1, 4096),
    "hidden": Range("int", 1, MAX_FEATURES),
    "context": Range("int", 1, 256),
    "embed_dim": Range("int", 1, 1024),
    "lr": Range("float", 0, MAX_LR, lo_open=True),
    "weight_decay": Range("float", 0, MAX_WEIGHT_DECAY),
    "workers": Range("int", 1, 1024),
    "peers": Range("int", 1, 32),
    "port": Range("int", 0, 65535),
    "wait_peers": Range("int", 0, 1000),
    "save_every": Range("int", 0, MAX_STEPS),
    "timeout": Range("float", 0, 86400, lo_open=True),
    "verify_rate": Range("float", 0, 1),
    "strikes": Range("int", 1, 1000),
    "length": Range("int", 1, 100_000),
    "temperature": Range("float", 0, 10),
    "image_size": Range("int", 1, 1024),
    "augment_shift": Range("int", 0, 8),
    "lr_warmup": Range("int", 0, MAX_STEPS),
    "lr_decay_steps": Range("int", 0, MAX_STEPS),
    "replicas": Range("int", 1, MAX_REPLICAS),
    "sync_every": Range("int", 1, MAX_SYNC_EVERY),
    "outer_lr": Range("float", 0, MAX_OUTER_LR, lo_open=True),
    "outer_momentum": Range("float", 0, 0.999),
    "moments_every": Range("int", 1, MAX_MOMENTS_EVERY),
    "take": Range("int", 1, 1_000_000),  # engine/hub.py MAX_TAKE
}
PAGE_SETTINGS = ("steps", "seed", "batch", "micro_batch", "hidden", "context", "lr", "replicas",
                 "sync_every", "outer_lr", "outer_momentum")

_INT = re.compile(r"[+-]?[0-9]{1,30}")
_FLOAT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,4})?")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_setting(name: str, raw: str) -> int | float:
    """The value of setting ``name`` typed as ``raw``; SpecError("<reason>") when it is not a
    plain decimal number in its range. The reason is the page's too (settings_check.js)."""
    rng = SETTINGS[name]
    text = str(raw).strip()
    v: int | float | None = None
    if len(text) <= 64 and (_INT if rng.kind == "int" else _FLOAT).fullmatch(text):
        v = int(text, 10) if rng.kind == "int" else float(text)
    if v is None or not rng.holds(v):
        raise SpecError(f"{rng.text}, not '{raw}'")
    return v


def setting_type(name: str):
    """An argparse ``type=`` for setting ``name``: the value, or a one-line usage error."""
    def parse(raw: str):
        try:
            return check_setting(name, raw)
        except SpecError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = name
    return parse


def check_value(name: str, v) -> None:
    """SpecError("--flag must be ...") unless ``v`` (already a number) is in its range."""
    if v is not None and not SETTINGS[name].holds(v):
        raise SpecError(f"{flag(name)} {SETTINGS[name].text}, not '{v}'")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``PROG: error: --lr must be ... (see PROG --help)``,
    not the usage block first."""

    def format_help(self) -> str:
        """--help shows each setting's range (from SETTINGS) after its own words."""
        for a in self._actions:
            rng = SETTINGS.get(getattr(a.type, "__name__", ""))
            text = rng.text.removeprefix("must be ") if rng is not None else ""
            if text and a.help and not a.help.endswith(text):
                a.help += f"; {text}"
        return super().format_help()

    def error(self, message: str):
        m = re.match(r"argument (--[\w-]+)(?:/-\w)?: (.*)", message, re.S)
        if m:
            name, rest = m.groups()
            message = (rest if rest.startswith(name) else f"{name} {rest}"
                       if rest.startswith(("must", "takes")) else f"{name}: {rest}")
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_run_arguments(p: argparse.ArgumentParser, steps: int = DEFAULT_STEPS) -> None:
    d = Hyper()
    g = p.add_argument_group("run settings")
    g.add_argument("--task", default="digits",
                   help=f"one of {', '.join(TASKS)} (default digits), or a task of your own "
                        f"named module:Name (daisychain/task.py, examples/my_task.py)")
    g.add_argument("--data", default=None,
                   help="text task: a local .txt/.csv/.json/.parquet file or a cached HF dataset "
                        "(default: the embedded Zen of Python); image task: a Keras .npz, a "
                        "folder of class subfolders, an HF image .parquet/.arrow file or an HF "
                        "dataset name (default: the embedded MNIST digits)")
    g.add_argument("--image-size", type=setting_type("image_size"), default=None, metavar="N",
                   help="image task: resize every image to N x N (default: keep the size)")
    g.add_argument("--column", default="text", help="text column of --data (default text)")
    h = p.add_argument_group("Hugging Face data sets, streamed (engine/hub.py)")
    h.add_argument("--stream", action="store_true",
                   help="text or image task: read the first --take rows of the Hub data set "
                        "named by --data, in order (downloads only those rows; the dataset "
                        "fingerprint names set, config, split, revision and count)")
    h.add_argument("--take", type=setting_type("take"), default=None, metavar="N",
                   help="with --stream: rows to read")
    h.add_argument("--split", default="train", help="with --stream: the split (default train)")
    h.add_argument("--config", default=None, metavar="NAME",
                   help="with --stream: the data set's configuration (default: its default)")
    h.add_argument("--revision", default=None, metavar="REV",
                   help="with --stream: a commit, tag or branch (default: the current commit, "
                        "pinned when read)")
    g.add_argument("--context", type=setting_type("context"), default=8, help="text task: context window (default 8)")
    g.add_argument("--steps", type=setting_type("steps"), default=None,
                   help=f"optimizer steps (default {steps}; image task {IMAGE_DEFAULTS['steps']})")
    p.set_defaults(_default_steps=steps)
    g.add_argument("--seed", type=setting_type("seed"), default=d.seed, help="run seed (default 0)")
    g.add_argument("--batch", type=setting_type("batch"), default=d.batch, help=f"global batch (default {d.batch})")
    g.add_argument("--micro-batch", type=setting_type("micro_batch"), default=d.micro_batch,
                   help=f"samples per micro-batch (default {d.micro_batch})")
    g.add_argument("--lr", type=setting_type("lr"), default=None,
                   help=f"Adam learning rate (default {d.lr}; image task {IMAGE_DEFAULTS['lr']})")
    g.add_argument("--augment-shift", type=setting_type("augment_shift"), default=None, metavar="PX",
                   help="image task: shift each training image by up to PX pixels, drawn from the "
                        f"seed (default {IMAGE_DEFAULTS['augment_shift']}; 0 = off)")
    g.add_argument("--lr-warmup", type=setting_type("lr_warmup"), default=None, metavar="STEPS",
                   help="linear learning-rate warm-up steps (default 0; image task "
                        f"{IMAGE_DEFAULTS['lr_warmup']}, at most --steps / 10)")
    g.add_argument("--lr-decay-steps", type=setting_type("lr_decay_steps"), default=None, metavar="STEPS",
                   help="linear learning-rate decay to 0 at this step (default 0 = constant; "
                        "image task: --steps)")
    g.add_argument("--weight-decay", type=setting_type("weight_decay"), default=d.weight_decay,
                   help="decoupled weight decay (default 0)")
    g.add_argument("--hidden", type=setting_type("hidden"), default=None,
                   help="hidden units of the one hidden layer (default 128); see --layers")
    g.add_argument("--layers", type=parse_layers, default=None, metavar="W1,W2,...",
                   help="hidden widths, comma-separated, e.g. 256,256 for two hidden layers of "
                        "256 (default: one hidden layer of --hidden); image task: convN (N 3x3 "
                        "filters), convNkK (KxK), pool (2x2 max), then widths, e.g. "
                        "conv16,pool,conv32,pool,128; text task: blockWhH transformer blocks "
                        "(width W, H heads), e.g. block64h4,block64h4 with --context 32; not "
                        "together with --hidden")
    g.add_argument("--embed-dim", type=setting_type("embed_dim"), default=16, help="text task: embedding size (default 16)")
    g.add_argument("--replicas", type=setting_type("replicas"), default=d.replicas, metavar="R",
                   help="local steps: R replicas train apart for --sync-every inner steps, then "
                        "an outer step on their averaged change (default 1: synchronous); with "
                        "local steps --steps counts rounds")
    g.add_argument("--sync-every", type=setting_type("sync_every"), default=d.sync_every, metavar="H",
                   help="local steps: inner Adam steps of each replica a round (default 1)")
    g.add_argument("--outer-lr", type=setting_type("outer_lr"), default=d.outer_lr,
                   help=f"local steps: the outer Nesterov step's rate (default {d.outer_lr}; "
                        f"1 with --outer-momentum 0 is plain averaging)")
    g.add_argument("--outer-momentum", type=setting_type("outer_momentum"), default=d.outer_momentum,
                   help=f"local steps: the outer step's momentum (default {d.outer_momentum})")
    g.add_argument("--moments-every", type=setting_type("moments_every"), default=d.moments_every, metavar="K",
                   help=f"local steps: the replicas' inner moments cross the wire every K rounds, "
                        f"the other rounds carry the deltas only; the result is the same bits "
                        f"for any K (default {d.moments_every})")


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
        elif t.isascii() and item_stack(t):  # convN, convNkK, pool, blockWhH: checked in full below
            items.append(t)
        else:
            raise argparse.ArgumentTypeError(
                f"--layers takes comma-separated hidden widths such as 256,256 (for images "
                f"convN, convNkK, pool; for text blockWhH transformer blocks), not {text!r}")
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
    if getattr(args, "steps", None) is None:
        args.steps = IMAGE_DEFAULTS["steps"] if image else getattr(args, "_default_steps", DEFAULT_STEPS)
    for name in ("steps", "seed", "batch", "micro_batch", "hidden", "context", "embed_dim",
                 "lr", "weight_decay", "image_size", "augment_shift", "lr_warmup", "lr_decay_steps",
                 "replicas", "sync_every", "outer_lr", "outer_momentum", "moments_every"):
        check_value(name, getattr(args, name, None))
    task_default = defaults(args.task if args.task in TASK_DEFAULTS else "digits", args.steps)

    def pick(name: str):
        v = getattr(args, name, None)
        return task_default[name] if v is None else v

    if not image and (pick("augment_shift") or getattr(args, "image_size", None) is not None):
        raise SpecError("--augment-shift and --image-size apply to the image task")
    hp = Hyper(lr=pick("lr"), weight_decay=args.weight_decay, batch=args.batch,
               micro_batch=args.micro_batch, seed=args.seed,
               augment_shift=pick("augment_shift"), lr_warmup=pick("lr_warmup"),
               lr_decay_steps=pick("lr_decay_steps"),
               **{k: getattr(args, k) for k in LOCAL_ARGS if getattr(args, k, None) is not None})
    hp.validate()
    from daisychain.task import resolve_task, task_dataset

    own = resolve_task(args.task)  # a task of your own (daisychain/task.py), or None
    hidden = hidden_setting(args)
    stream = hub_stream(args)
    if own is None:
        ds = prepare_task(args.task, args.data, args.column, args.context,
                          image_size=getattr(args, "image_size", None), stream=stream)
    elif args.data:
        raise DataError("--data applies to the built-in tasks; a task of your own gives its "
                        "data()")
    else:
        ds = task_dataset(own, args.task if isinstance(args.task, str) else None)
        hidden = _task_layers(own) if hidden is None else hidden
    spec = model_for(ds, hidden, args.embed_dim)
    check_size(spec, hp)
    return RunSettings(ds, spec, hp, args.steps)


def check_size(spec, hp) -> None:
    """SpecError when a micro-batch of the model needs more than the engine holds: a
    transformer's attention scores (b * heads * context^2, attention.MAX_SCORES)."""
    for l in spec.layers:
        kind_of(l).check_size(l, hp.micro_batch)


def hub_stream(args: argparse.Namespace):
    """The ``--stream`` request (engine/hub.py HubStream), or None; SpecError for --take and
    friends without --stream, or --stream without --take."""
    from daisychain.engine.hub import HubStream

    check_value("take", getattr(args, "take", None))
    extra = [flag(n) for n in ("take", "config", "revision")
             if getattr(args, n, None) is not None] + (
        ["--split"] if getattr(args, "split", "train") != "train" else [])
    if not getattr(args, "stream", False):
        if extra:
            raise SpecError(f"{', '.join(extra)} {'applies' if len(extra) == 1 else 'apply'} to "
                            f"--stream")
        return None
    if args.take is None:
        raise SpecError("--stream needs --take N, the rows to read")
    return HubStream(args.take, args.split, args.config, args.revision)


LOCAL_ARGS = ("replicas", "sync_every", "outer_lr", "outer_momentum", "moments_every")

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


#: the flags of add_run_arguments, in --help order
RUN_FLAGS = ("task", "data", "column", "stream", "take", "split", "config", "revision", "context", "steps", "seed", "batch", "micro_batch", "lr",
             "weight_decay", "hidden", "layers", "embed_dim", "replicas", "sync_every", "outer_lr",
             "outer_momentum", "moments_every")


def train_command(args: argparse.Namespace) -> str:
    """The ``daisychain train ...`` command of the same run (the flags that differ from the
    defaults, and always --steps): it prints the same params-sha256."""
    import shlex

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    defaults = p.parse_args([])
    words = ["daisychain", "train"]
    for name in RUN_FLAGS:
        v = getattr(args, name, None)
        if v is None or (v == getattr(defaults, name) and name != "steps"):
            continue
        if name == "layers":
            v = ",".join(map(str, v))
        words += [flag(name)] if v is True else [flag(name), str(v)]
    return " ".join(shlex.quote(w) for w in words)


def _task_layers(task):
    """A task of your own's ``layers`` as --layers items (checked like the flag)."""
    try:
        return parse_layers(task.layers)
    except argparse.ArgumentTypeError as exc:
        raise DataError(f"--task {type(task).__name__}: layers: {exc}") from None

"""The Python API: build a model, train it alone or in a room, evaluate, predict, save.

    import daisychain as dc
    model = dc.Model("256,256")                       # or dc.Model([dc.Dense(256), dc.Dense(256)])
    result = dc.train(model, "digits", steps=300, seed=0)
    result.params_sha256                              # == `daisychain train --layers 256,256 --steps 300`
    result.accuracy, result.predict(x), result.save("run.pt"), result.export("run.onnx")

Every call goes through the command line's own path: the keyword arguments are the run
flags (``lr=`` is ``--lr``), checked against the same table (``engine/settings.py``
SETTINGS) into the same RunSettings, and trained by the same loop (``engine/cli.py``), so a
call gives the bits of the command. A bad value raises :class:`SettingsError` with one line.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from daisychain.engine.data import TASKS, DataError
from daisychain.engine.spec import SpecError


class SettingsError(ValueError):
    """A value the API cannot take, with the command line's words for it."""


# ---------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Dense:
    """A hidden linear layer of ``width`` units (then ReLU): ``--layers`` item ``width``."""

    width: int

    @property
    def item(self):
        return self.width


@dataclass(frozen=True)
class Conv:
    """A conv2d of ``filters`` k x k filters (then ReLU): ``convN`` / ``convNkK``."""

    filters: int
    kernel: int = 3

    @property
    def item(self):
        return f"conv{self.filters}" + (f"k{self.kernel}" if self.kernel != 3 else "")


@dataclass(frozen=True)
class Pool:
    """A 2x2 max pool: ``pool``."""

    @property
    def item(self):
        return "pool"


class Model:
    """The layers of a model from the registry, written as the ``--layers`` string
    (``"256,256"``, ``"conv16,pool,128"``) or as objects (``[Dense(256), Conv(16), Pool()]``,
    plain ints and item strings too); None: the task's default. The input and output layers
    come from the data (``engine/data.py`` model_for), as on the command line.
    ``embed_dim`` / ``context``: the text task's embedding size and window."""

    def __init__(self, layers=None, *, embed_dim: int = 16, context: int = 8):
        from daisychain.engine.settings import check_value, parse_layers

        if layers is None:
            self.items = None
        else:
            text = layers if isinstance(layers, str) else ",".join(
                str(getattr(t, "item", t)) for t in (layers if isinstance(layers, (list, tuple)) else [layers]))
            try:
                self.items = tuple(parse_layers(text))
            except argparse.ArgumentTypeError as exc:
                raise SettingsError(_words(str(exc))) from None
        for name, v in (("embed_dim", embed_dim), ("context", context)):
            _checked(check_value, name, v)
        self.embed_dim, self.context = embed_dim, context

    @property
    def layers(self) -> str | None:
        """The ``--layers`` text of this model (None: the task's default)."""
        return None if self.items is None else ",".join(map(str, self.items))

    def __repr__(self) -> str:
        return f"Model({self.layers!r})"


def _words(message: str) -> str:
    """The command line's reason with the API's names: ``--lr`` -> ``lr``."""
    import re

    return re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), message)


def _checked(fn, *args):
    try:
        return fn(*args)
    except (SpecError, DataError, ValueError) as exc:
        raise SettingsError(_words(str(exc))) from None


# ---------------------------------------------------------------------- the run


class _ArraysTask:
    """Arrays given to :func:`train`, as a task of your own."""

    def __init__(self, arrays, layers: str, loss: str, classes=None):
        self.arrays, self.layers, self.loss = arrays, layers, loss
        self.name = "arrays"
        if classes is not None:
            self.classes = classes

    def data(self):
        return self.arrays


def _namespace(model: Model | None, data, task: str | None, loss: str | None = None,
               **settings) -> argparse.Namespace:
    """The Namespace the command line would parse for the same run (defaults from
    add_run_arguments, then the given settings, each checked against SETTINGS)."""
    from daisychain.engine.settings import RUN_FLAGS, SETTINGS, add_run_arguments, check_value
    from daisychain.engine.sources import source_kind

    p = argparse.ArgumentParser(add_help=False)
    add_run_arguments(p)
    ns = p.parse_args([])
    # the run flags but those the call's own arguments and Model give
    allowed = (set(RUN_FLAGS) | {"image_size", "augment_shift", "lr_warmup", "lr_decay_steps"}) - {
        "task", "data", "layers", "hidden", "context", "embed_dim"}
    for name, v in settings.items():
        if name not in allowed:
            raise SettingsError(f"unknown setting {name}=; the settings are {', '.join(sorted(allowed))}")
        if name in SETTINGS:
            _checked(check_value, name, v)
        setattr(ns, name, v)
    model = model if model is not None else Model()
    if not isinstance(model, Model):
        model = Model(model)
    ns.layers, ns.embed_dim, ns.context = model.items, model.embed_dim, model.context
    if task is not None and task not in TASKS and not hasattr(task, "data"):
        raise SettingsError(f"task must be one of {', '.join(TASKS)} or a task object, not {task!r}")
    if isinstance(data, (tuple, list)) or type(data).__name__ == "Dataset":
        ns.task = _ArraysTask(data, model.layers or "128", loss or _guess_loss(data))
    elif loss is not None:
        raise SettingsError("loss= applies to arrays; a task gives its own loss, and the "
                            "built-in tasks are cross_entropy")
    elif hasattr(data, "data") and hasattr(data, "loss"):  # a task of your own
        ns.task = data
    elif isinstance(data, str) and data in TASKS:
        ns.task = data
    elif isinstance(data, (str, Path)):
        src = str(data)
        if task is None:
            kind = _checked(source_kind, src)
            task = "image" if kind == "dir" or src.lower().endswith(".npz") else "text"
        ns.task, ns.data = task, src
    else:
        raise SettingsError("data must be digits, text, image, a path, a Hugging Face data set "
                            "name, (x_train, y_train, x_test, y_test) arrays or a task object, "
                            f"not {type(data).__name__}")
    return ns


def _guess_loss(arrays) -> str:
    """Float targets are a regression (mse); whole-number labels are classes."""
    try:
        y = np.asarray(arrays[1])
    except Exception:  # noqa: BLE001 - arrays_dataset says what is wrong
        return "cross_entropy"
    return "mse" if y.dtype.kind == "f" or y.ndim == 2 else "cross_entropy"


def _settings(ns: argparse.Namespace):
    from daisychain.engine.settings import USER_ERRORS, settings_from_args

    try:
        return settings_from_args(ns)
    except USER_ERRORS as exc:
        raise SettingsError(_words(str(exc))) from None


@dataclass
class Result:
    """A trained run: its hash and metrics, and the trained replica for predict/save/export."""

    params_sha256: str
    steps: int
    accuracy: float  #: test accuracy (0.0 for an "mse" model)
    loss: float | None  #: the last step's training loss
    test_mse: float | None  #: an "mse" model's test mean squared error (None otherwise)
    run_id: str
    metrics: dict = field(repr=False)  #: everything `daisychain train --json` prints
    trainer: object = field(repr=False, default=None)

    def predict(self, x) -> np.ndarray:
        """Class ids (N,) for rows x (an "mse" model: its outputs (N, K)); x as the data's
        x: (N, features) numbers, (N, context) token ids, or (N, C*H*W) uint8 pixels."""
        tr = self.trainer
        ds = tr.ds
        x = np.asarray(x)
        if x.ndim == 1:
            x = x[None]
        want = ds.x_train.shape[1:]
        if x.shape[1:] != want:
            raise SettingsError(f"predict takes rows of shape {list(want)}, not {list(x.shape[1:])}")
        x = x.astype(ds.x_train.dtype)
        return tr.engine.predict(tr.state.theta, x, tr.hp.micro_batch)

    def evaluate(self, split: str = "test") -> dict:
        """``{"accuracy": ...}`` (or ``{"mse": ...}``) over the data's test or train rows."""
        if split not in ("test", "train"):
            raise SettingsError(f"split must be test or train, not {split!r}")
        mse = self.trainer.mse(split)
        return {"mse": mse} if mse is not None else {"accuracy": self.trainer.accuracy(split)}

    def save(self, path) -> str:
        """Write the run's state as a ``.pt`` (the checkpoint every command reads)."""
        from daisychain.engine.checkpoint import write_checkpoint_file

        tr = self.trainer
        st = tr.state
        local = tr.hp.local
        try:
            write_checkpoint_file(path, tr.identity, st.step, st.theta, getattr(st, "adam", None),
                                  tr.ds.meta.get("vocab"), st if local else None)
        except OSError as exc:
            raise SettingsError(f"cannot write the checkpoint {path}: {exc.strerror or exc}") from None
        return str(path)

    def export(self, path) -> dict:
        """Export as ``.safetensors`` or ``.onnx`` (``daisychain export``)."""
        import tempfile

        from daisychain.export import ExportError, export

        with tempfile.TemporaryDirectory() as tmp:
            ck = self.save(Path(tmp) / "run.pt")
            try:
                return export(ck, path)
            except ExportError as exc:
                raise SettingsError(str(exc)) from None


def _result(out: dict, tr) -> Result:
    return Result(out["params_sha256"], out["steps"], out["accuracy"], out["loss"],
                  out.get("test_mse"), out["run_id"], out, tr)


def train(model: Model | str | None = None, data="digits", *, steps: int | None = None,
          seed: int = 0, task: str | None = None, loss: str | None = None, quiet: bool = True,
          workers: int = 1, save: str | None = None, **settings) -> Result:
    """Train ``model`` on ``data`` in this process, as ``daisychain train`` does (the same
    bits). ``data``: "digits", "text", "image", a file, folder or Hugging Face data set name
    (``task="text"`` or ``"image"`` when the name does not say), ``(x_train, y_train,
    x_test, y_test)`` arrays (float targets: mse), or a task of your own. ``settings``: the
    other run flags with ``_`` for ``-`` (``lr``, ``batch``, ``micro_batch``, ``replicas``,
    ...). ``loss``: for arrays, "cross_entropy" or "mse" (default: mse for float targets).
    ``save``: also write the checkpoint there."""
    from daisychain.engine.settings import check_value

    if steps is not None:
        _checked(check_value, "steps", steps)
    _checked(check_value, "seed", seed)
    _checked(check_value, "workers", workers)
    ns = _namespace(model, data, task, loss, seed=seed, **({"steps": steps} if steps is not None else {}),
                    **settings)
    return _run(_settings(ns), workers, quiet, save, None)


def _run(rs, workers: int, quiet: bool, save, resume) -> Result:
    from daisychain.engine.checkpoint import CheckpointError
    from daisychain.engine.cli import train_with_trainer

    try:
        out, tr = train_with_trainer(rs, workers, "round-robin", "fast", quiet, save, 0, resume)
    except CheckpointError as exc:
        raise SettingsError(str(exc)) from None
    except OSError as exc:
        raise SettingsError(f"cannot write the checkpoint: {exc}") from None
    return _result(out, tr)


def resume(path, data=None, *, steps: int | None = None, quiet: bool = True,
           save: str | None = None) -> Result:
    """Go on from a checkpoint ``.pt`` to ``steps`` (the run's total; default: train no more)
    with the run's own settings, read from the file. ``data``: the run's data when it is not
    a built-in task's default (a path, arrays, or the task object); its fingerprint must be
    the checkpoint's, or SettingsError says what differs."""
    from daisychain.engine.checkpoint import CheckpointError, read_checkpoint_file
    from daisychain.engine.settings import RunSettings, check_value
    from daisychain.engine.spec import Hyper, ModelSpec

    try:
        ck = read_checkpoint_file(path)
    except CheckpointError as exc:
        raise SettingsError(str(exc)) from None
    ident = ck.identity
    if steps is not None:
        _checked(check_value, "steps", steps)
    total = ck.step if steps is None else steps
    if data is None:
        data = ident.get("task")
        if data not in TASKS:
            raise SettingsError(f"{path} is a run of task {data!r}: give its data (data=...)")
    spec = ModelSpec.from_json(ident["model"])
    ns = _namespace(None, data, None, steps=max(total, 1))
    rs = _settings(ns)
    if rs.ds.fingerprint != ident.get("dataset"):
        raise SettingsError(f"{path} was trained on data with fingerprint "
                            f"{str(ident.get('dataset'))[:16]}..., not this data "
                            f"({rs.ds.fingerprint[:16]}...)")
    rs = RunSettings(rs.ds, spec, Hyper(**ident["hyper"]), total)
    return _run(rs, 1, quiet, save, str(path))  # total == its step: nothing more to train


def join(server: str, room: str = "network", *, name: str = "python", capacity: float | None = None,
         loopback: bool = False, task=None, save: str | None = None) -> dict:
    """Join a room as a headless peer (``daisy-peer --server SERVER --room ROOM``) and train
    with it until the run ends; returns the peer's summary (``params_sha256``, ``accuracy``,
    ...). ``task``: a task of your own (object or ``module:Name``) this peer expects the run
    to train; a run on other data is refused in words. ``loopback``: ICE candidates on
    127.0.0.1 only (every peer on this machine)."""
    from daisychain.peer.node import Node, NodeOptions
    from daisychain.peer.rtc import use_loopback_only

    expect = None
    if task is not None:
        from daisychain.task import resolve_task, task_dataset

        try:
            own = resolve_task(task)
            expect = task_dataset(own).fingerprint if own is not None else None
        except DataError as exc:
            raise SettingsError(str(exc)) from None
    if loopback:
        use_loopback_only()
    node = Node(NodeOptions(server=server, room=room, name=name, capacity=capacity,
                            save_checkpoint=save, expect_dataset=expect))
    return asyncio.run(node.main())

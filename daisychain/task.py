"""Tasks of your own: a Python object that gives the data and names the model.

The smallest task is a class with three members (anything more is optional)::

    class MyTask:
        layers = "32,32"               # the --layers string (hidden widths)
        loss = "mse"                   # "cross_entropy" or "mse"
        def data(self):                # (x_train, y_train, x_test, y_test), numpy arrays
            ...

``x`` is (N, F) numbers (float features); ``y`` is (N,) whole-number class ids in
[0, classes) for cross-entropy, or (N,) / (N, K) finite targets for mse. ``data()`` may
also return one ``datasets.Dataset`` with columns ``x`` and ``y`` (split 90/10 in order).
Optional: ``classes`` (cross-entropy: default max label + 1) and ``name`` (the task's name in
the run identity and on the wire; default the class name, lower case).

Name it with ``--task pkg.module:MyTask`` (``daisychain train``, ``daisy-peer``, ``demo``,
``cluster``, ``serve``) or pass an instance to ``daisychain.train``. Its data becomes a
dataset like any other (``engine/data.py``'s DCDS bytes), so its fingerprint is part of the
run's identity: a peer whose task gives other data is refused in words.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import numpy as np

from daisychain.engine.dataset import ARRAYS, DataError, Dataset
from daisychain.engine.spec import LOSSES

MEMBERS = ("layers", "loss", "data")
MAX_ROWS = 10_000_000  #: rows a task's data may have (train + test)
MAX_TASK_FEATURES = 65536  #: features of one row
MAX_OUTPUTS = 4096  #: classes (cross-entropy) or targets (mse)
_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class Task:
    """An optional base class: subclass it and set ``layers``, ``loss`` and ``data()``."""

    layers: str = "128"
    loss: str = "cross_entropy"

    def data(self):  # pragma: no cover - a subclass gives it
        raise NotImplementedError("a task's data() returns (x_train, y_train, x_test, y_test)")


def is_task_ref(text) -> bool:
    """True for ``"pkg.module:Name"`` (a task of your own), not for a built-in task name."""
    return isinstance(text, str) and ":" in text


def load_task(ref: str):
    """The task named ``"pkg.module:Name"``: the module is imported (the current folder first,
    like ``python -m``), ``Name`` is taken from it and, when it is a class, instantiated.
    DataError says in one line what is wrong: a bad name, a module that does not import, a
    missing member."""
    ref = str(ref).strip()
    if not _REF.fullmatch(ref):
        raise DataError(f"--task {ref!r}: a task of your own is named module:Name, such as "
                        f"examples.my_task:MyTask")
    module_name, attr = ref.split(":", 1)
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's, in words
        raise DataError(f"--task {ref}: cannot import {module_name}: "
                        f"{type(exc).__name__}: {exc}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise DataError(f"--task {ref}: {module_name} has no member {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001
            raise DataError(f"--task {ref}: {attr}() failed: {type(exc).__name__}: {exc}") from None
    check_task(obj, ref)
    return obj


def check_task(task, what: str | None = None) -> None:
    """DataError unless ``task`` has ``layers`` (a string), ``loss`` (one of LOSSES) and a
    callable ``data``."""
    what = what or type(task).__name__
    missing = [m for m in MEMBERS if not hasattr(task, m)]
    if missing:
        raise DataError(f"--task {what}: the task has no {', '.join(missing)} (a task needs "
                        f"layers, loss and data())")
    if not callable(task.data):
        raise DataError(f"--task {what}: data must be a method returning "
                        f"(x_train, y_train, x_test, y_test)")
    if not isinstance(task.layers, str):
        raise DataError(f"--task {what}: layers is the --layers string such as \"64,64\", "
                        f"not {task.layers!r}")
    if task.loss not in LOSSES:
        raise DataError(f"--task {what}: loss must be one of {', '.join(LOSSES)}, not {task.loss!r}")


def task_name(task) -> str:
    """The task's name in the run identity and in ``/data/<name>.dcds``."""
    name = getattr(task, "name", None) or type(task).__name__
    name = re.sub(r"[^a-z0-9_-]", "", str(name).lower())[:40]
    return name or "task"


def _from_hf(ds) -> tuple:
    """A ``datasets.Dataset`` with columns x and y: the first 90% of rows train, the rest test."""
    for col in ("x", "y"):
        if col not in ds.column_names:
            raise DataError(f"a task's datasets.Dataset needs columns x and y; it has {ds.column_names}")
    x = np.asarray(ds["x"])
    y = np.asarray(ds["y"])
    cut = (len(x) * 9) // 10
    return x[:cut], y[:cut], x[cut:], y[cut:]


def arrays_dataset(arrays, loss: str, name: str = "task", classes: int | None = None,
                   source: str = "arrays") -> Dataset:
    """A Dataset from (x_train, y_train, x_test, y_test): every shape, type and value checked,
    DataError in one line otherwise. x becomes float64 (N, F); y int32 labels (cross-entropy)
    or float64 (N, K) targets (mse)."""
    if type(arrays).__name__ == "Dataset" and hasattr(arrays, "column_names"):
        arrays = _from_hf(arrays)
    if not isinstance(arrays, (tuple, list)) or len(arrays) != 4:
        raise DataError("a task's data() returns four arrays: (x_train, y_train, x_test, y_test)")
    if loss not in LOSSES:
        raise DataError(f"loss must be one of {', '.join(LOSSES)}, not {loss!r}")
    out = {}
    for key, a in zip(ARRAYS, arrays):
        try:
            a = np.asarray(a)
        except Exception as exc:  # noqa: BLE001 - ragged lists and the like
            raise DataError(f"{key}: not an array ({exc})") from None
        if a.dtype.kind not in "biuf":
            raise DataError(f"{key}: numbers are needed, not {a.dtype}")
        out[key] = a
    for split in ("train", "test"):
        x, y = out[f"x_{split}"], out[f"y_{split}"]
        if x.ndim != 2 or not 1 <= x.shape[1] <= MAX_TASK_FEATURES:
            raise DataError(f"x_{split} must be (rows, features) with 1 to {MAX_TASK_FEATURES} "
                            f"features, not shape {list(x.shape)}")
        if len(y) != len(x):
            raise DataError(f"y_{split} has {len(y)} rows, x_{split} {len(x)}")
        if not np.isfinite(x.astype(np.float64)).all():
            raise DataError(f"x_{split} holds a value that is not finite")
    if out["x_test"].shape[1] != out["x_train"].shape[1]:
        raise DataError(f"x_test has {out['x_test'].shape[1]} features, x_train "
                        f"{out['x_train'].shape[1]}")
    if len(out["x_train"]) < 1 or len(out["x_train"]) + len(out["x_test"]) > MAX_ROWS:
        raise DataError(f"a task has 1 to {MAX_ROWS} training rows, not {len(out['x_train'])}")
    if loss == "mse":
        ys = []
        for split in ("train", "test"):
            y = out[f"y_{split}"].astype(np.float64)
            y = y.reshape(len(y), 1) if y.ndim == 1 else y
            if y.ndim != 2 or not 1 <= y.shape[1] <= MAX_OUTPUTS:
                raise DataError(f"y_{split} for mse must be (rows,) or (rows, targets), not shape "
                                f"{list(out[f'y_{split}'].shape)}")
            if not np.isfinite(y).all():
                raise DataError(f"y_{split} holds a target that is not finite")
            ys.append(y)
        if ys[0].shape[1] != ys[1].shape[1]:
            raise DataError(f"y_test has {ys[1].shape[1]} targets, y_train {ys[0].shape[1]}")
        ytr, yte = ys
        k = ytr.shape[1]
    else:
        labels = []
        for split in ("train", "test"):
            y = out[f"y_{split}"]
            if y.ndim != 1 or (y.dtype.kind == "f" and not np.array_equal(y, np.floor(y))):
                raise DataError(f"y_{split} for cross_entropy must be (rows,) whole-number class "
                                f"ids, not {y.dtype} of shape {list(y.shape)}")
            labels.append(y.astype(np.int64))
        top = max(int(l.max()) if len(l) else 0 for l in labels) + 1
        k = top if classes is None else int(classes)
        if not 2 <= k <= MAX_OUTPUTS or any(len(l) and (l.min() < 0 or l.max() >= k) for l in labels):
            raise DataError(f"class ids must lie in [0, classes) with 2 to {MAX_OUTPUTS} classes "
                            f"(classes {k})")
        ytr, yte = (l.astype(np.int32) for l in labels)
    meta = {"source": source, "features": int(out["x_train"].shape[1]), "loss": loss}
    return Dataset(name, np.ascontiguousarray(out["x_train"], np.float64), np.ascontiguousarray(ytr),
                   np.ascontiguousarray(out["x_test"], np.float64), np.ascontiguousarray(yte),
                   classes=int(k), meta=meta)


def task_dataset(task, what: str | None = None) -> Dataset:
    """The task's data as a Dataset (its fingerprint is the run's dataset fingerprint)."""
    check_task(task, what)
    try:
        arrays = task.data()
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code, in words
        raise DataError(f"--task {what or type(task).__name__}: data() failed: "
                        f"{type(exc).__name__}: {exc}") from None
    try:
        return arrays_dataset(arrays, task.loss, task_name(task), getattr(task, "classes", None),
                              source=f"task {type(task).__name__}")
    except DataError as exc:
        raise DataError(f"--task {what or type(task).__name__}: data(): {exc}") from None


def resolve_task(task):
    """A task of your own from ``--task`` (a ``module:Name`` string, or an object given by
    code), or None for a built-in task name."""
    if is_task_ref(task):
        return load_task(task)
    if task is None or isinstance(task, str):
        return None
    if isinstance(task, type):  # the class itself: its instance, as --task does
        try:
            task = task()
        except Exception as exc:  # noqa: BLE001 - the user's code, in words
            raise DataError(f"--task {task.__name__}: {task.__name__}() failed: "
                            f"{type(exc).__name__}: {exc}") from None
    check_task(task)
    return task

"""Tasks and their data: the embedded digits task, character-level text through HF
``datasets`` (local files, or hub datasets already in the local cache; never a download),
and images (``daisychain.engine.images``: the embedded MNIST and the ``--data`` sources).

A prepared dataset is a few arrays plus a header, serialised as one byte string (the
"DCDS" format below) whose SHA-256 is the dataset fingerprint, part of a run's identity.
Peers fetch exactly these bytes from the server and check the fingerprint.

The types they share (``Dataset``, ``DataError``, the DCDS format) are
``daisychain.engine.dataset``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from daisychain.engine import prng
from daisychain.engine.dataset import OFFLINE_SWITCHES, OWN_OFFLINE, TASKS, DataError, Dataset
from daisychain.engine.spec import DEFAULT_CNN, ModelSpec, SpecError, char_mlp, cnn, gpt, is_transformer, mlp

# --------------------------------------------------------------------------- digits


def load_digits() -> Dataset:
    """scikit-learn's 8x8 handwritten digits (1,797 images, shipped inside its wheel): a fixed
    1,437 / 360 train/test split by the integer PRNG (seed 0, the split stream)."""
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    x = d.data.astype(np.float64)  # pixel intensities 0..16
    y = d.target.astype(np.int32)
    perm = prng.permutation(0, prng.STREAM_SPLIT, len(x))
    tr, te = perm[:1437], perm[1437:]
    return Dataset("digits", x[tr], y[tr], x[te], y[te], classes=10,
                   meta={"source": "sklearn.datasets.load_digits", "features": 64})


# --------------------------------------------------------------------------- text

_EXTENSIONS = {".txt": "text", ".text": "text", ".md": "text", ".csv": "csv", ".tsv": "csv",
               ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def _zen() -> str:
    import codecs
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # `import this` prints the Zen
        import this
    return codecs.decode(this.s, "rot13")


def load_text_source(source: str | None, column: str = "text", split: str = "train",
                     max_chars: int = 200_000, cache_dir: str | None = None) -> tuple[str, str]:
    """(text, description) from a local file, a cached hub dataset, or the embedded default
    (the Zen of Python, which ships inside every Python). ``cache_dir``: where ``datasets``
    writes its Arrow cache for a local file (default: its own cache; the server passes a
    temporary folder for uploads so that they leave nothing on disk)."""
    if not source:
        return _zen(), "embedded: the Zen of Python"
    for name in OFFLINE_SWITCHES:  # never a download here; a user's own setting stays theirs
        if name not in os.environ:
            os.environ[name] = "1"
            OWN_OFFLINE.add(name)
    import contextlib
    import io

    try:
        import datasets
        datasets.logging.set_verbosity_error()
        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover - datasets is a dependency
        raise DataError("the `datasets` package is needed to load text datasets") from None
    from daisychain.engine.sources import check_file, source_kind

    kind = source_kind(source)
    path = Path(source).expanduser()
    if kind == "dir":
        raise DataError(f"{source}: a folder; give one text file (.txt, .csv, .json, "
                        f".parquet) or a Hugging Face data set name")
    if kind == "file":
        builder = _EXTENSIONS.get(path.suffix.lower())
        if builder is None:
            raise DataError(f"{source}: unknown file type {path.suffix!r}; use one of "
                            f"{sorted(_EXTENSIONS)}")
        check_file(path, text=builder != "parquet")
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            if kind == "file":
                kwargs = {"delimiter": "\t"} if path.suffix.lower() == ".tsv" else {}
                if cache_dir is not None:
                    kwargs["cache_dir"] = cache_dir
                ds = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
            else:
                ds = datasets.load_dataset(source, split=split)
    except DataError:
        raise
    except FileNotFoundError as exc:
        raise DataError(f"dataset {source!r} not found: it is neither a local file nor a hub "
                        f"dataset in the local Hugging Face cache (DaisyChain never downloads "
                        f"at run time) ({exc})") from None
    except Exception as exc:  # datasets raises many types (ConnectionError, DatasetNotFoundError...)
        if kind == "hub" and (isinstance(exc, ConnectionError) or "NotFound" in type(exc).__name__):
            raise DataError(f"{source!r} is not a local file, and no Hugging Face data set of that "
                            f"name is in the local cache (DaisyChain never downloads at run time: "
                            f"see the README's \"Your own data\")") from None
        raise DataError(f"could not load dataset {source!r}: {type(exc).__name__}: {exc}. "
                        f"Give a local .txt/.csv/.json/.parquet file or a hub dataset that is "
                        f"already in the local cache.") from None
    if column not in ds.column_names:
        raise DataError(f"dataset {source!r} has no column {column!r}; its columns are "
                        f"{ds.column_names} (choose one with --column)")
    feature = ds.features[column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise DataError(f"column {column!r} of {source!r} holds {feature}, not text")
    text = join_rows(ds[column], max_chars)
    if len(text) < 64:
        raise DataError(f"dataset {source!r} column {column!r} has only {len(text)} characters")
    return text, f"{source} [{split}].{column}"


def join_rows(cells, max_chars: int, where: str | None = None) -> str:
    """The text cells joined by newlines up to ``max_chars`` (empty cells skipped); ``where``:
    refuse a cell that is not text, naming the data set and column in words."""
    pieces, total = [], 0
    for i, cell in enumerate(cells):
        if cell is None:
            continue
        if where is not None and not isinstance(cell, str):
            raise DataError(f"{where} holds {type(cell).__name__}, not text (row {i}); choose a "
                            f"column with --column")
        pieces.append(cell)
        total += len(cell) + 1
        if total >= max_chars:
            break
    return "\n".join(pieces)[:max_chars]


def _streamed_text(source: str, column: str, stream, max_chars: int) -> tuple[str, str, dict]:
    """The first rows of a Hub data set's text column (``engine/hub.py``), joined as
    load_text_source joins a file's."""
    from daisychain.engine.hub import describe, stream_rows

    rows, what = stream_rows(source, stream, [column])
    text = join_rows((row.get(column) for row in rows), max_chars, f"{source}: column {column!r}")
    if len(text) < 64:
        raise DataError(f"{source}: the first {what['rows']} rows of column {column!r} have only "
                        f"{len(text)} characters")
    return text, f"{describe(what)}.{column}", what


def load_text(source: str | None = None, column: str = "text", context: int = 8,
              split: str = "train", max_chars: int = 200_000,
              cache_dir: str | None = None, stream=None) -> Dataset:
    """Character-level next-character task: context window of ids -> the next id.
    Vocabulary: the sorted distinct characters. The first 90% of windows train, the rest test.
    ``stream``: a ``hub.HubStream`` (``--stream --take N``): the first rows of a Hub set."""
    if not 1 <= context <= 256:
        raise DataError("--context must lie in [1, 256]")
    hub = None
    if stream is not None:
        if not source:
            raise DataError("--stream reads a Hugging Face data set: give its name with --data")
        text, desc, hub = _streamed_text(source, column, stream, max_chars)
    else:
        text, desc = load_text_source(source, column, split, max_chars, cache_dir)
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = np.array([index[c] for c in text], np.int32)
    meta = {"source": desc, "context": context, "vocab": "".join(vocab)}
    if hub is not None:
        meta["hub"] = hub  # what was read: set, config, split, revision, rows
    return _windowed(ids, context, len(vocab), meta)


def _windowed(ids: np.ndarray, context: int, classes: int, meta: dict) -> Dataset:
    n = len(ids) - context
    if n < 20:
        raise DataError(f"text of {len(ids)} characters is too short for context {context}")
    win = np.lib.stride_tricks.sliding_window_view(ids, context)[:n].astype(np.int32)
    tgt = ids[context:].astype(np.int32)
    cut = (n * 9) // 10
    return Dataset("text", np.ascontiguousarray(win[:cut]), tgt[:cut],
                   np.ascontiguousarray(win[cut:]), tgt[cut:], classes=classes, meta=meta)


#: the windows (int32) a re-windowing makes at most: 64 MiB (a page's context slider, served by
#: the server: server/routes/data.py); ``daisychain train --context`` has no such cap
MAX_WINDOW_BYTES = 64 << 20


def with_context(ds: Dataset, context: int) -> Dataset:
    """The text data set ``ds`` with ``context`` ids a window: the same data set ``load_text``
    makes from the same text with ``--context context`` (same fingerprint). The text's ids are
    ``ds``'s first window followed by every target, so nothing is read again. DataError with
    words for data that is not the text task's, a context outside [1, 256], a text too short,
    or windows over MAX_WINDOW_BYTES."""
    if ds.task != "text" or ds.kind != "tokens" or not isinstance(ds.meta.get("context"), int) \
            or not len(ds.y_train):
        raise DataError("a context applies to the text task's data only")
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= 256:
        raise DataError("--context must lie in [1, 256]")
    if context == ds.meta["context"]:
        return ds
    ids = np.concatenate([ds.x_train[0], ds.y_train, ds.y_test]).astype(np.int32)
    if (len(ids) - context) * context * 4 > MAX_WINDOW_BYTES:
        raise DataError(f"context {context} on {len(ids):,} characters makes "
                        f"{(len(ids) - context) * context * 4 >> 20} MiB of windows; the server "
                        f"makes at most {MAX_WINDOW_BYTES >> 20} MiB (daisychain train has no cap)")
    return _windowed(ids, context, ds.classes, {**ds.meta, "context": context})


def prepare_task(task: str, data: str | None = None, column: str = "text", context: int = 8,
                 split: str = "train", cache_dir: str | None = None,
                 image_size: int | None = None, stream=None) -> Dataset:
    """``stream``: a ``hub.HubStream`` (``--stream --take N``) for a text or image task."""
    if image_size is not None and task != "image":
        raise DataError("--image-size applies to the image task")
    if stream is not None and task not in ("text", "image"):
        raise DataError("--stream applies to the text and image tasks")
    if task == "image":
        from daisychain.engine.images import load_images

        return load_images(data, image_size, None if column == "text" else column, cache_dir,
                           stream)
    if task == "digits":
        if data:
            raise DataError("--data applies to the text task; digits is embedded")
        return load_digits()
    if task == "text":
        return load_text(data, column, context, split, cache_dir=cache_dir, stream=stream)
    raise DataError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")


def model_for(ds: Dataset, hidden=None, dim: int = 16) -> ModelSpec:
    """The model of a prepared dataset. ``hidden``: one width, or the --layers items (widths,
    and for an image task ``convN``/``convNkK``/``pool``), or None for the task's default
    (one hidden layer of 128; an image task: spec.DEFAULT_CNN). The digits MLP stacks the
    widths, the char model stacks them after its embedding, an image model is ``spec.cnn``.
    The loss is the dataset's (``meta["loss"]``, a task of your own: daisychain/task.py;
    default cross-entropy)."""
    import dataclasses

    spec = _model_for(ds, hidden, dim)
    loss = ds.meta.get("loss", "cross_entropy") if isinstance(ds.meta, dict) else "cross_entropy"
    if loss == spec.loss:
        return spec
    spec = dataclasses.replace(spec, loss=str(loss))
    spec.validate()
    return spec


def _model_for(ds: Dataset, hidden, dim: int) -> ModelSpec:
    if isinstance(hidden, (int, np.integer)) and hidden < 1:
        raise SpecError("--hidden must be >= 1")
    if ds.kind == "image":
        items = DEFAULT_CNN if hidden is None else (hidden,) if isinstance(hidden, (int, np.integer)) else hidden
        return cnn(ds.image_shape, items, ds.classes)
    hidden = 128 if hidden is None else hidden
    if is_transformer(hidden):
        if ds.kind != "tokens":
            raise SpecError(f"transformer blocks read a text (--task text), not the {ds.task} task")
        return gpt(ds.classes, ds.x_train.shape[1], hidden)
    if not isinstance(hidden, (int, np.integer)) and any(isinstance(t, str) for t in hidden):
        raise SpecError(f"conv and pool layers need an image input (--task image); the "
                        f"{ds.task} task takes dense widths only")
    if ds.kind == "dense":
        return mlp(ds.x_train.shape[1], hidden, ds.classes)
    return char_mlp(ds.classes, ds.x_train.shape[1], dim, hidden)

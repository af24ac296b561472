"""Hugging Face data sets by name, streamed: ``--data owner/name --stream --take N``.

The first N rows of one split are read in order through ``datasets.load_dataset(...,
streaming=True)``: nothing but those rows is downloaded, and the same name, config, split,
revision and N give the same rows, so the same dataset fingerprint. What was read is named
in the dataset (``meta["hub"]``: set, config, split, revision, rows), which the fingerprint
covers. A Hub name's revision is pinned to the commit it resolved to when none is given.

A local folder of parquet files in the Hub's layout, or one ``.parquet`` file, goes through
the same code path (the tests' way: nothing downloads in CI). Each failure is one line: a
name that does not exist, no network, a gated set.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from daisychain.engine.dataset import DataError

MAX_TAKE = 1_000_000  #: most rows a --take reads


@dataclass(frozen=True)
class HubStream:
    """What ``--stream`` reads: ``take`` rows of ``split`` (config ``config``, revision
    ``revision``: None pins the current commit of a Hub name)."""

    take: int
    split: str = "train"
    config: str | None = None
    revision: str | None = None


def hub_error(exc: BaseException, name: str) -> DataError:
    """The one line for a failed Hub read: gated, not found, or no network."""
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    if "gated" in low or type(exc).__name__ == "GatedRepoError":
        return DataError(f"{name}: a gated data set on the Hugging Face Hub: accept its terms on "
                         f"https://huggingface.co/datasets/{name} and log in (hf auth login), "
                         f"then try again")
    if isinstance(exc, ConnectionError) or "offline" in low or "connect" in low or "timed out" in low:
        return DataError(f"{name}: cannot reach the Hugging Face Hub (no network, or "
                         f"HF_HUB_OFFLINE is set); a data set already read once is in the local "
                         f"cache without --stream")
    if isinstance(exc, FileNotFoundError) or "notfound" in low.replace(" ", "") or "doesn't exist" in low:
        return DataError(f"{name}: no such data set on the Hugging Face Hub (a name is "
                         f"owner/name, as on huggingface.co/datasets)")
    return DataError(f"{name}: cannot stream it: {text[:300]}")


@contextlib.contextmanager
def _online():
    """Lift, for a --stream read, the offline switches that DaisyChain's cached text reader
    turned on in this process (``dataset.OWN_OFFLINE``); a user's own HF_HUB_OFFLINE stays."""
    import os

    from daisychain.engine.dataset import OFFLINE_SWITCHES, OWN_OFFLINE

    users = [n for n in (*OFFLINE_SWITCHES, "TRANSFORMERS_OFFLINE") if n in os.environ and n not in OWN_OFFLINE]
    if not OWN_OFFLINE or users:  # nothing of ours to lift, or the user asked for offline
        yield
        return

    import datasets.config
    import huggingface_hub.constants

    saved = {n: os.environ.pop(n) for n in list(OWN_OFFLINE) if n in os.environ}
    flags = (datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE,
             huggingface_hub.constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = False
    huggingface_hub.constants.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        os.environ.update(saved)
        (datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE,
         huggingface_hub.constants.HF_HUB_OFFLINE) = flags


def _revision(name: str, stream: HubStream) -> str:
    """The commit a Hub name's read is pinned to ("local" for a local folder or file)."""
    if Path(name).expanduser().exists():
        return "local"
    if stream.revision:
        return stream.revision
    from huggingface_hub import HfApi

    try:
        return HfApi().dataset_info(name, revision=None).sha or "main"
    except Exception as exc:  # noqa: BLE001 - every Hub failure is one line
        raise hub_error(exc, name) from None


def stream_rows(name: str, stream: HubStream, columns: list[str] | None = None,
                prepare=None) -> tuple[list[dict], dict]:
    """The first ``stream.take`` rows (dicts) of the split, in order, and what was read
    (``{"set", "config", "split", "revision", "rows"}``). ``prepare(ds) -> ds``: applied to
    the IterableDataset before it is read (an image column cast to bytes). DataError in one
    line."""
    if not 1 <= stream.take <= MAX_TAKE:
        raise DataError(f"--take must lie in [1, {MAX_TAKE}]")
    try:
        import datasets
        datasets.logging.set_verbosity_error()
        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover - datasets is a dependency
        raise DataError("the `datasets` package is needed to stream Hugging Face data sets") from None
    with _online():
        return _read(name, stream, columns, prepare, datasets)


def _read(name: str, stream: HubStream, columns, prepare, datasets) -> tuple[list[dict], dict]:
    path = Path(name).expanduser()
    revision = _revision(name, stream)
    kwargs = {"split": stream.split, "streaming": True}
    if path.is_file():
        if path.suffix.lower() != ".parquet":
            raise DataError(f"{name}: --stream reads a Hub name, a folder of parquet files or a "
                            f".parquet file, not {path.suffix or 'this file'}")
        args = ("parquet",)
        kwargs["data_files"] = {stream.split: str(path)}
    else:
        args = (str(path) if path.exists() else name,)
        if stream.config:
            kwargs["name"] = stream.config
        if revision != "local":
            kwargs["revision"] = revision
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            ds = datasets.load_dataset(*args, **kwargs)
            if columns:
                missing = [c for c in columns if c not in (ds.column_names or columns)]
                if missing:
                    raise DataError(f"{name}: no column {missing[0]!r}; its columns are "
                                    f"{ds.column_names}")
            if prepare is not None:
                ds = prepare(ds)
            rows = list(islice(iter(ds), stream.take))
    except DataError:
        raise
    except ValueError as exc:  # a split or config it does not have
        raise DataError(f"{name}: {str(exc)[:300]}") from None
    except Exception as exc:  # noqa: BLE001 - datasets raises many types
        raise hub_error(exc, name) from None
    if not rows:
        raise DataError(f"{name}: split {stream.split!r} has no rows")
    what = {"set": name if revision != "local" else path.name, "config": stream.config or "default",
            "split": stream.split, "revision": revision, "rows": len(rows)}
    return rows, what


def describe(what: dict) -> str:
    """``owner/name [config] split@revision, first N rows``: the dataset's source line."""
    return (f"{what['set']} [{what['config']}] {what['split']}@{str(what['revision'])[:12]}, "
            f"first {what['rows']} rows (streamed)")

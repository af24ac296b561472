"""The datasets a host can train on, and turning a room's own text file into one.

- ``GET /datasets``: ``{"datasets": [...], "max_upload_bytes": N}``, each entry
  ``{id, task, name, origin, fingerprint, train, test, classes, train_args}``: the embedded
  tasks (``origin`` "embedded"), the sets the server was started with (``daisychain serve
  --data ...``, "server") and, for a request with a room member's credential
  (``X-Daisy-Token``, ``uploads.UploadGuard``), the files its room uploaded ("upload").
  ``train_args`` are the ``daisychain train`` flags that make the same DCDS (same
  fingerprint).
- ``POST /datasets/upload?name=FILE.txt[&column=text]``, header ``X-Daisy-Token``, body: the
  file's bytes (at most ``MAX_UPLOAD_BYTES``): a ``.txt`` or ``.csv`` file becomes the text
  task's DCDS exactly as ``daisychain train --task text --data FILE.txt`` makes it, run in
  the folder holding the file, and is kept for the sender's room. Everything about the
  request goes through the app's ``UploadGuard`` (credential, rate, body, parse pool, the
  room's quotas); the file's columns, rows and distinct characters are checked before it is
  parsed. Answers the new entry, or 4xx/503 with ``{"error": reason}`` (nothing is kept).
- ``GET /data/<task>.dcds[?fingerprint=HEX]``: as ``daisychain.server.routes.data`` (which it wraps),
  plus the server's sets by fingerprint, and an upload only to a current member of its room
  (credential in ``X-Daisy-Token``); to anyone else an upload's fingerprint is a 404 like
  any unknown one. ``&context=N`` re-windows either (the text task, as ``data.py``); an
  upload re-windowed is not kept (a peer without it asks the run's host over the data channel).
"""

from __future__ import annotations

import asyncio
import csv
import io
import re
import tempfile
import threading
from pathlib import Path

from aiohttp import web

from daisychain.engine.data import TASKS, DataError, Dataset, prepare_task
from daisychain.engine.dataset import EMBEDDED_NAMES

from ..config import ServerConfig
from ..guard import refusal
from ..uploads import guard_of
from .data import context_of, data_routes, rewindowed

MAX_UPLOAD_BYTES = 1 << 20
_LOAD_LOCK = threading.Lock()
UPLOAD_SUFFIXES = (".txt", ".csv")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,79}$")
COLUMN_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_ .-]{0,63}$")


def _entry(ds: Dataset, name: str, origin: str, train_args: list[str]) -> dict:
    return {"id": ds.fingerprint[:16], "task": ds.task, "name": name, "origin": origin,
            "fingerprint": ds.fingerprint, "train": int(len(ds.y_train)),
            "test": int(len(ds.y_test)), "classes": int(ds.classes),
            "source": str(ds.meta.get("source", "")), "train_args": train_args,
            # the model's input (the page's size sliders build the spec from it)
            "kind": ds.kind, "input": [int(v) for v in ds.x_train.shape[1:]],
            **({"image_shape": list(ds.image_shape)} if ds.kind == "image" else {}),
            **({"loss": ds.meta["loss"]} if ds.meta.get("loss", "cross_entropy") != "cross_entropy" else {})}


def check_upload(data: bytes, name: str, config: ServerConfig) -> None:
    """What the file may cost to parse, checked in one linear pass before it is parsed:
    UTF-8, distinct characters (the text task's classes), and for a CSV its columns and rows.
    Raises DataError with words."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{name} is not UTF-8 text (byte {exc.start})") from None
    chars = len(set(text))
    if chars > config.upload_max_classes:
        raise DataError(f"{name} has {chars} distinct characters; the text task makes one "
                        f"class of each and this server takes at most "
                        f"{config.upload_max_classes}")
    if Path(name).suffix.lower() != ".csv":
        return
    rows = 0
    try:
        for row in csv.reader(io.StringIO(text, newline="")):
            rows += 1
            if len(row) > config.upload_max_columns:
                raise DataError(f"{name} has {len(row)} columns in row {rows}; this server "
                                f"takes at most {config.upload_max_columns}")
            if rows > config.upload_max_rows + 1:
                raise DataError(f"{name} has more than {config.upload_max_rows} rows; this "
                                f"server takes at most {config.upload_max_rows}")
    except csv.Error as exc:
        raise DataError(f"{name} is not a CSV file this server reads (row {rows + 1}: "
                        f"{str(exc)[:120]})") from None


def _from_upload(data: bytes, name: str, column: str,
                 config: ServerConfig | None = None) -> Dataset:
    """The DCDS ``daisychain train --task text --data NAME`` makes from these bytes."""
    check_upload(data, name, config or ServerConfig())  # concurrently: it is plain Python
    # one `datasets` load at a time: it redirects the process's stderr while it runs (and
    # keeps global state), which two threads at once would leave redirected; bounded by the
    # checks above, one takes ~0.2 s for a 1 MiB text here
    with _LOAD_LOCK, tempfile.TemporaryDirectory(prefix="daisy-upload-") as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        try:
            # the Arrow cache goes into the temporary folder too: an upload leaves nothing
            # on disk (in the Hugging Face cache it would grow by every upload, for good)
            ds = prepare_task("text", str(path), column, cache_dir=str(Path(tmp) / "cache"))
        except DataError as exc:
            raise DataError(str(exc).replace(str(path), name)) from None
    # the source names the file as the train command is given it (in the file's folder)
    meta = dict(ds.meta)
    meta["source"] = meta["source"].replace(str(path), name, 1)
    return Dataset(ds.task, ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.classes, meta)


def dataset_routes(datasets: dict[str, Dataset] | None = None) -> list[web.AbstractRouteDef]:
    """``datasets``: {name: Dataset} the server serves as they are (a task name as key, as
    the demo gives them, or a ``--data`` source)."""
    given = dict(datasets or {})
    inner = data_routes(given)[0].handler
    server_sets: dict[str, dict] = {}
    for key, ds in given.items():
        own = ":" in key  # a task of your own (``serve --task module:Name``, daisychain/task.py)
        args = ["--task", key if own else ds.task]
        if key not in TASKS and not own:
            args += ["--data", key]
        if ds.meta.get("image_size"):
            args += ["--image-size", str(ds.meta["image_size"])]
        # shown to every client: the file's name, never the server's path to it
        shown = key if key in TASKS or own else Path(key).name or key
        entry = _entry(ds, shown, "server", args)
        if own:  # the task's model, which the page fills in (webui/page/panels/model_data.js)
            from daisychain.task import load_task
            entry["layers"] = load_task(key).layers
        server_sets[ds.fingerprint] = {"ds": ds, "entry": entry}
    embedded: dict[str, Dataset] = {}

    async def serve_data(request: web.Request) -> web.StreamResponse:
        fp = request.query.get("fingerprint", "")
        up = None
        if fp and fp not in server_sets:  # the server's sets are served by ``inner``
            guard = guard_of(request)
            who = guard.viewer(request)
            up = guard.shelf.get(who.room_key if who else None, fp)
        if up is None or up.entry["task"] != request.match_info["task"]:
            return await inner(request)
        context = context_of(request)
        if context is not None:  # the page's context slider on the room's text (data.py)
            ds = await rewindowed(await asyncio.to_thread(Dataset.from_bytes, up.data), context)
            return web.Response(body=ds.to_bytes(), content_type="application/octet-stream",
                                headers={"X-Dataset-Fingerprint": ds.fingerprint,
                                         "Cache-Control": "no-store"})
        return web.Response(body=up.data, content_type="application/octet-stream",
                            headers={"X-Dataset-Fingerprint": fp, "Cache-Control": "no-store"})

    async def listing(request: web.Request) -> web.Response:
        out = []
        for task in TASKS:
            if task not in embedded:
                try:
                    embedded[task] = await asyncio.to_thread(prepare_task, task)
                except DataError:
                    continue
            ds = embedded[task]
            name = EMBEDDED_NAMES.get(task, task)
            out.append(_entry(ds, name, "embedded", ["--task", task]))
        out += [s["entry"] for s in server_sets.values()]
        who = guard_of(request).viewer(request)
        out += guard_of(request).shelf.entries(who.room_key if who else None)
        return web.json_response({"datasets": out, "max_upload_bytes": MAX_UPLOAD_BYTES},
                                 headers={"Cache-Control": "no-store"})

    async def upload(request: web.Request) -> web.Response:
        guard = guard_of(request)
        name = request.query.get("name", "").strip()
        column = request.query.get("column", "text").strip() or "text"
        if not NAME_RE.match(name) or Path(name).suffix.lower() not in UPLOAD_SUFFIXES:
            raise refusal("the file must be a .txt or .csv file with a plain name (letters, "
                          "digits, . _ - and spaces)")
        if not COLUMN_RE.match(column):
            raise refusal("the column name has characters it cannot have")
        who, data = await guard.receive(request, MAX_UPLOAD_BYTES)
        if not data:
            raise refusal(f"{name} is empty")
        try:
            ds = await guard.work(request, _from_upload, data, name, column, guard.config)
        except DataError as exc:
            raise refusal(str(exc)[:400]) from None
        args = ["--task", "text", "--data", name] + (["--column", column] if column != "text" else [])
        entry = _entry(ds, name, "upload", args)
        if not guard.hub.has_room(who.room_key):  # it closed while the file was parsed
            raise refusal("your room closed while the file was read", 403)
        guard.shelf.add(who.room_key, guard.address(request), ds, entry)
        return web.json_response(entry)

    return [web.get("/data/{task:[a-z0-9_-]{1,40}}.dcds", serve_data),
            web.get("/datasets", listing),
            web.post("/datasets/upload", upload)]

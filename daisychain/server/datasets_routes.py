"""The datasets a host can train on, and turning a host's own text file into one.

- ``GET /datasets``: ``{"datasets": [...], "max_upload_bytes": N}``, each entry
  ``{id, task, name, origin, fingerprint, train, test, classes, train_args}``: the embedded
  tasks (``origin`` "embedded"), the sets the server was started with (``daisychain serve
  --data ...``, "server") and the files hosts sent ("upload"). ``train_args`` are the
  ``daisychain train`` flags that make the same DCDS (same fingerprint).
- ``POST /datasets/upload?name=FILE.txt[&column=text]``, body: the file's bytes (at most
  ``MAX_UPLOAD_BYTES``): a ``.txt`` or ``.csv`` file becomes the text task's DCDS exactly as
  ``daisychain train --task text --data FILE.txt`` makes it, run in the folder holding the
  file. Answers the new entry, or 400/413 with the reason in words (nothing is kept).
- ``GET /data/<task>.dcds[?fingerprint=HEX]``: as ``daisychain.server.data`` (which it wraps),
  plus the uploaded and server sets by fingerprint.

At most ``MAX_UPLOADS`` uploaded sets are kept (the oldest goes); one upload is converted at
a time.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from collections import OrderedDict
from pathlib import Path

from aiohttp import web

from daisychain.engine.data import TASKS, DataError, Dataset, prepare_task

from .data import data_routes

MAX_UPLOAD_BYTES = 1 << 20
MAX_UPLOADS = 16
UPLOAD_SUFFIXES = (".txt", ".csv")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,79}$")
COLUMN_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_ .-]{0,63}$")


def _entry(ds: Dataset, name: str, origin: str, train_args: list[str]) -> dict:
    return {"id": ds.fingerprint[:16], "task": ds.task, "name": name, "origin": origin,
            "fingerprint": ds.fingerprint, "train": int(len(ds.y_train)),
            "test": int(len(ds.y_test)), "classes": int(ds.classes),
            "source": str(ds.meta.get("source", "")), "train_args": train_args}


def _from_upload(data: bytes, name: str, column: str) -> Dataset:
    """The DCDS ``daisychain train --task text --data NAME`` makes from these bytes."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{name} is not UTF-8 text (byte {exc.start})") from None
    with tempfile.TemporaryDirectory(prefix="daisy-upload-") as tmp:
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
        args = ["--task", ds.task]
        if key not in TASKS:
            args += ["--data", key]
        # shown to every client: the file's name, never the server's path to it
        shown = key if key in TASKS else Path(key).name or key
        server_sets[ds.fingerprint] = {"ds": ds, "entry": _entry(ds, shown, "server", args)}
    uploads: OrderedDict[str, dict] = OrderedDict()
    embedded: dict[str, Dataset] = {}
    lock = asyncio.Lock()

    def by_fp(fp: str) -> Dataset | None:
        hit = uploads.get(fp) or server_sets.get(fp)
        return hit["ds"] if hit else None

    async def serve_data(request: web.Request) -> web.StreamResponse:
        fp = request.query.get("fingerprint", "")
        ds = by_fp(fp) if fp else None
        if ds is None or ds.task != request.match_info["task"]:
            return await inner(request)
        return web.Response(body=ds.to_bytes(), content_type="application/octet-stream",
                            headers={"X-Dataset-Fingerprint": ds.fingerprint,
                                     "Cache-Control": "no-cache"})

    async def listing(request: web.Request) -> web.Response:
        out = []
        for task in TASKS:
            if task not in embedded:
                try:
                    embedded[task] = await asyncio.to_thread(prepare_task, task)
                except DataError:
                    continue
            ds = embedded[task]
            name = "handwritten digits (8x8)" if task == "digits" else "the Zen of Python (characters)"
            out.append(_entry(ds, name, "embedded", ["--task", task]))
        out += [s["entry"] for s in server_sets.values()]
        out += [u["entry"] for u in reversed(uploads.values())]
        return web.json_response({"datasets": out, "max_upload_bytes": MAX_UPLOAD_BYTES},
                                 headers={"Cache-Control": "no-store"})

    async def upload(request: web.Request) -> web.Response:
        name = request.query.get("name", "").strip()
        column = request.query.get("column", "text").strip() or "text"
        if not NAME_RE.match(name) or Path(name).suffix.lower() not in UPLOAD_SUFFIXES:
            raise web.HTTPBadRequest(text="the file must be a .txt or .csv file with a plain "
                                          "name (letters, digits, . _ - and spaces)")
        if not COLUMN_RE.match(column):
            raise web.HTTPBadRequest(text="the column name has characters it cannot have")
        if request.content_length is not None and request.content_length > MAX_UPLOAD_BYTES:
            raise web.HTTPRequestEntityTooLarge(max_size=MAX_UPLOAD_BYTES,
                                                actual_size=request.content_length,
                                                text=f"{name} is over the {MAX_UPLOAD_BYTES // 1024} KiB limit")
        buf = bytearray()
        async for chunk in request.content.iter_chunked(64 * 1024):
            buf += chunk
            if len(buf) > MAX_UPLOAD_BYTES:
                raise web.HTTPRequestEntityTooLarge(max_size=MAX_UPLOAD_BYTES, actual_size=len(buf),
                                                    text=f"{name} is over the {MAX_UPLOAD_BYTES // 1024} KiB limit")
        if not buf:
            raise web.HTTPBadRequest(text=f"{name} is empty")
        async with lock:
            try:
                ds = await asyncio.to_thread(_from_upload, bytes(buf), name, column)
            except DataError as exc:
                msg = str(exc)
                raise web.HTTPBadRequest(text=msg[:400]) from None
        args = ["--task", "text", "--data", name] + (["--column", column] if column != "text" else [])
        entry = _entry(ds, name, "upload", args)
        uploads.pop(ds.fingerprint, None)
        uploads[ds.fingerprint] = {"ds": ds, "entry": entry}
        while len(uploads) > MAX_UPLOADS:
            uploads.popitem(last=False)
        return web.json_response(entry)

    return [web.get("/data/{task:[a-z0-9_-]{1,40}}.dcds", serve_data),
            web.get("/datasets", listing),
            web.post("/datasets/upload", upload)]

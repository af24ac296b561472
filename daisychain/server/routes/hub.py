"""A Hugging Face data set fetched by the server for a room: ``serve --hub``.

``POST /datasets/hub?name=owner/name&take=N[&task=text|image][&column=C][&split=S][&config=K]``,
header ``X-Daisy-Token``, no body. The server reads the first N rows of the set, streamed
(``engine/hub.py``, as ``daisychain train --task T --data owner/name --stream --take N``
does), and keeps the result for the sender's room exactly as an uploaded file: the same
credential (a member allowed to upload for its room), the same rate, the same parse pool
and timeout, the same per-room and per-address quotas (``uploads.UploadGuard``, ``Shelf``).
Off unless the server was started with ``--hub``; N is capped by ``--hub-max-rows``; only a
Hub name (``owner/name``) is taken, never a path. ``--hub-mirror DIR`` reads
``DIR/owner/name`` instead of the Hub (a machine without internet; the tests). Answers the
new ``/datasets`` entry, or 4xx/503 with ``{"error": reason}`` (nothing is kept).
"""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import web

from daisychain.engine.data import DataError, prepare_task
from daisychain.engine.spec import SpecError

from ..guard import refusal
from ..uploads import guard_of
from .datasets import _LOAD_LOCK, COLUMN_RE, _entry

HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
TASKS = ("text", "image")


def _source(name: str, mirror: str) -> str:
    """What the reader is given: the Hub name, or its folder in the mirror."""
    if not mirror:
        return name
    root = Path(mirror).resolve()
    path = (root / name).resolve()
    if root not in path.parents:  # HUB_NAME has no "..", but say it twice
        raise DataError(f"{name}: not a data set name")
    if not path.is_dir():
        raise DataError(f"{name}: no such data set on this server's Hub mirror")
    return str(path)


def _from_hub(name: str, task: str, take: int, column: str, split: str, config: str | None,
              cfg) -> tuple:
    """The DCDS ``daisychain train --task TASK --data NAME --stream --take N`` makes."""
    from daisychain.engine.hub import HubStream

    source = _source(name, cfg.hub_mirror)
    with _LOAD_LOCK:  # one `datasets` load at a time (it redirects stderr while it runs)
        ds = prepare_task(task, source, column if task == "text" else "text",
                          stream=HubStream(take, split, config))
    if task == "text" and ds.classes > cfg.upload_max_classes:
        raise DataError(f"{name} has {ds.classes} distinct characters; the text task makes one "
                        f"class of each and this server takes at most {cfg.upload_max_classes}")
    return ds, source


def hub_routes() -> list[web.AbstractRouteDef]:
    async def fetch(request: web.Request) -> web.Response:
        from daisychain.engine.settings import check_setting

        guard = guard_of(request)
        cfg = guard.config
        if not cfg.hub:
            raise refusal("this server does not fetch Hugging Face data sets (its operator can "
                          "start it with daisychain serve --hub)", 403)
        q = request.query
        name = q.get("name", "").strip()
        task = q.get("task", "text").strip()
        column = q.get("column", "text").strip() or "text"
        split = q.get("split", "train").strip() or "train"
        config = q.get("config", "").strip() or None
        if not HUB_NAME.match(name) or ".." in name:
            raise refusal("give a Hugging Face data set name such as owner/name (letters, digits, "
                          ". _ -)")
        if task not in TASKS:
            raise refusal(f"task must be text or image, not {task[:20]!r}")
        for label, value in (("column", column), ("split", split), ("config", config or "x")):
            if not COLUMN_RE.match(value):
                raise refusal(f"the {label} name has characters it cannot have")
        try:
            take = check_setting("take", q.get("take", ""))
        except SpecError as exc:
            raise refusal(f"the rows to read {exc}") from None
        if take > cfg.hub_max_rows:
            raise refusal(f"this server reads at most {cfg.hub_max_rows} rows of a data set, not "
                          f"{take}", 413, limit=cfg.hub_max_rows, current=take)
        who = guard.member(request, upload=True)
        guard.shelf.check_count(who.room_key)
        guard.charge(request, "upload", cfg.uploads_per_min)
        try:
            ds, source = await guard.work(request, _from_hub, name, task, take, column, split,
                                          config, cfg)
        except DataError as exc:
            raise refusal(str(exc).replace(cfg.hub_mirror.rstrip("/") + "/", "")[:400]
                          if cfg.hub_mirror else str(exc)[:400]) from None
        args = ["--task", task, "--data", source, "--stream", "--take", str(take)]
        args += ["--column", column] if task == "text" and column != "text" else []
        args += ["--split", split] if split != "train" else []
        args += ["--config", config] if config else []
        entry = _entry(ds, name, "upload", args)
        if not guard.hub.has_room(who.room_key):  # it closed while the set was read
            raise refusal("your room closed while the data set was read", 403)
        guard.shelf.add(who.room_key, guard.address(request), ds, entry)
        return web.json_response(entry)

    return [web.post("/datasets/hub", fetch)]

"""Training data over HTTP: ``GET /data/<task>.dcds`` serves a prepared dataset's DCDS bytes
(``docs/ENGINE.md``, "Data"); the peer checks their SHA-256 against the run's dataset
fingerprint before it trains.

Registered by ``create_app`` (its ``datasets`` argument). A dataset given
to :func:`data_routes` (e.g. the demo's, or a host's ``--data`` file) is served as is; any
other task of ``daisychain.engine.data.TASKS`` is prepared on first request with its default
source. ``?fingerprint=<hex>`` asks for a particular dataset: 404 when this server has none
with that fingerprint (the peer then asks its coordinator over the data channel).

``?context=N`` (the text task; N in ``--context``'s range, engine/settings.py SETTINGS): that
data set windowed with N ids, exactly as ``daisychain train --task text --context N`` makes
it from the same text (``engine.data.with_context``; the page's context slider). The last
``KEPT_CONTEXTS`` such sets are kept and served by their own fingerprint too, so a peer
joining a run on one finds it. A bad N, or data that takes none, is a 400 with the reason.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from aiohttp import web

from daisychain.engine.data import TASKS, DataError, Dataset, prepare_task, with_context
from daisychain.engine.spec import SpecError

#: re-windowed text sets (``?context=N``) kept for peers that join a run on one
KEPT_CONTEXTS = 8


def context_of(request: web.Request) -> int | None:
    """The ``context`` query's value, None without one; 400 with the flag's reason if bad."""
    raw = request.query.get("context")
    if raw is None:
        return None
    from daisychain.engine.settings import check_setting

    try:
        return int(check_setting("context", raw[:80]))
    except SpecError as exc:
        raise web.HTTPBadRequest(text=f"the context {exc}") from None


async def rewindowed(ds: Dataset, context: int) -> Dataset:
    """``ds`` with ``context`` (engine.data.with_context, off the event loop); 400 in words."""
    try:
        return await asyncio.to_thread(with_context, ds, context)
    except DataError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None


def data_routes(datasets: dict[str, Dataset] | None = None) -> list[web.AbstractRouteDef]:
    served: dict[str, Dataset] = dict(datasets or {})
    by_fp: dict[str, Dataset] = {ds.fingerprint: ds for ds in served.values()}
    blobs: dict[str, bytes] = {}  # fingerprint -> DCDS, encoded once (not once per request)
    # ?context=N sets, the last few: (the set's fingerprint, N) -> (its fingerprint, the set)
    windowed: OrderedDict[tuple[str, int], tuple[str, Dataset]] = OrderedDict()

    async def handler(request: web.Request) -> web.StreamResponse:
        task = request.match_info["task"]
        want = request.query.get("fingerprint")
        context = context_of(request)
        ds = None
        if want:
            ds = by_fp.get(want) or next((w for f, w in windowed.values() if f == want), None)
        if ds is None:
            ds = served.get(task)
            if ds is None and task in TASKS:
                try:
                    ds = await asyncio.to_thread(prepare_task, task)
                except DataError as exc:
                    raise web.HTTPNotFound(text=f"task {task}: {exc}") from None
                served[task] = ds
                by_fp[ds.fingerprint] = ds
        if ds is None or ds.task != task or (want and ds.fingerprint != want):
            raise web.HTTPNotFound(text=f"no dataset for task {task[:40]!r}"
                                        + (f" with fingerprint {want[:64]}" if want else ""))
        if context is not None:
            key = (ds.fingerprint, context)
            if key not in windowed:
                made = await rewindowed(ds, context)
                windowed[key] = (made.fingerprint, made)
            windowed.move_to_end(key)
            while len(windowed) > KEPT_CONTEXTS:
                windowed.popitem(last=False)
            ds = windowed[key][1]
        fp = ds.fingerprint
        etag = f'"{fp[:32]}"'
        headers = {"ETag": etag, "X-Dataset-Fingerprint": fp, "Cache-Control": "no-cache"}
        if etag in request.headers.get("If-None-Match", ""):
            return web.Response(status=304, headers=headers)
        blob = blobs.get(fp)
        if blob is None:
            blob = ds.to_bytes()  # a re-windowed set keeps its own (Dataset caches it)
            if fp in by_fp:
                blobs[fp] = blob
        return web.Response(body=blob, content_type="application/octet-stream", headers=headers)

    return [web.get("/data/{task:[a-z0-9_-]{1,40}}.dcds", handler)]

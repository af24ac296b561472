"""Training data over HTTP: ``GET /data/<task>.dcds`` serves a prepared dataset's DCDS bytes
(``docs/ENGINE.md``, "Data"); the peer checks their SHA-256 against the run's dataset
fingerprint before it trains.

Registered by ``create_app`` (its ``datasets`` argument). A dataset given
to :func:`data_routes` (e.g. the demo's, or a host's ``--data`` file) is served as is; any
other task of ``daisychain.engine.data.TASKS`` is prepared on first request with its default
source. ``?fingerprint=<hex>`` asks for a particular dataset: 404 when this server has none
with that fingerprint (the peer then asks its coordinator over the data channel).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from daisychain.engine.data import TASKS, DataError, Dataset, prepare_task


def data_routes(datasets: dict[str, Dataset] | None = None) -> list[web.AbstractRouteDef]:
    served: dict[str, Dataset] = dict(datasets or {})
    by_fp: dict[str, Dataset] = {ds.fingerprint: ds for ds in served.values()}
    blobs: dict[str, bytes] = {}  # fingerprint -> DCDS, encoded once (not once per request)

    async def handler(request: web.Request) -> web.StreamResponse:
        task = request.match_info["task"]
        want = request.query.get("fingerprint")
        ds = by_fp.get(want) if want else None
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
        fp = ds.fingerprint
        etag = f'"{fp[:32]}"'
        headers = {"ETag": etag, "X-Dataset-Fingerprint": fp, "Cache-Control": "no-cache"}
        if etag in request.headers.get("If-None-Match", ""):
            return web.Response(status=304, headers=headers)
        blob = blobs.get(fp)
        if blob is None:
            blob = blobs[fp] = ds.to_bytes()
        return web.Response(body=blob, content_type="application/octet-stream", headers=headers)

    return [web.get("/data/{task:[a-z0-9_-]{1,40}}.dcds", handler)]

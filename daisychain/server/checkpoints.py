"""Checkpoint conversion over HTTP, for pages (a browser cannot write or safely read a .pt):

* ``POST /checkpoint/export`` — body: a state blob (``daisychain.engine.checkpoint``,
  ``encode_state``); answer: the ``.pt`` file (``Content-Disposition: attachment``).
* ``POST /checkpoint/import`` — body: a ``.pt`` file; optional header
  ``X-Daisy-Expected-Identity`` (base64 of the run identity JSON) to check it against the
  run; answer: the state blob, with ``X-Daisy-Params-Sha256``. The page then broadcasts the
  state to its room, where every peer checks the hash again before restoring.

The server keeps nothing: both routes are pure conversions. Bad input gets 400 with
``{"error": message}``; torch's weights-only loader means nothing in a file executes.
"""

from __future__ import annotations

import asyncio
import base64
import json

from aiohttp import web

from daisychain.engine.checkpoint import (MAX_BYTES, CheckpointError, decode_state,
                                          encode_state, load_checkpoint, save_checkpoint)
from daisychain.engine.trainer import run_id

LIMIT = min(MAX_BYTES, 64 * 2**20)


async def _body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > LIMIT:
        raise _bad(f"body of {request.content_length} bytes is larger than {LIMIT}", 413)
    # StreamReader.read(n) returns what has arrived so far, not n bytes: read to the end
    chunks, size = [], 0
    while True:
        chunk = await request.content.read(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > LIMIT:
            raise _bad(f"body is larger than {LIMIT} bytes", 413)
        chunks.append(chunk)


def _bad(message: str, status: int = 400) -> web.HTTPException:
    cls = web.HTTPRequestEntityTooLarge if status == 413 else web.HTTPBadRequest
    kw = {"max_size": LIMIT, "actual_size": LIMIT + 1} if status == 413 else {}
    return cls(text=json.dumps({"error": message}), content_type="application/json", **kw)


async def export_checkpoint(request: web.Request) -> web.Response:
    data = await _body(request)
    try:
        ck = await asyncio.to_thread(decode_state, data)
        pt = await asyncio.to_thread(save_checkpoint, ck.identity, ck.step, ck.theta, ck.adam)
    except CheckpointError as exc:
        raise _bad(str(exc)) from None
    name = f"daisychain-{run_id(ck.identity)}-step{ck.step}.pt"
    return web.Response(body=pt, content_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{name}"',
                                 "X-Daisy-Params-Sha256": ck.params_sha256})


async def import_checkpoint(request: web.Request) -> web.Response:
    expected = None
    raw = request.headers.get("X-Daisy-Expected-Identity")
    if raw:
        try:
            expected = json.loads(base64.b64decode(raw, validate=True))
            if not isinstance(expected, dict):
                raise ValueError("not an object")
        except (ValueError, json.JSONDecodeError) as exc:
            raise _bad(f"X-Daisy-Expected-Identity is not base64 JSON: {exc}") from None
    data = await _body(request)
    try:
        ck = await asyncio.to_thread(load_checkpoint, data, expected)
    except CheckpointError as exc:
        raise _bad(str(exc)) from None
    blob = encode_state(ck.identity, ck.step, ck.theta, ck.adam)
    return web.Response(body=blob, content_type="application/octet-stream",
                        headers={"X-Daisy-Params-Sha256": ck.params_sha256,
                                 "X-Daisy-Step": str(ck.step)})


def checkpoint_routes() -> list[web.AbstractRouteDef]:
    return [web.post("/checkpoint/export", export_checkpoint),
            web.post("/checkpoint/import", import_checkpoint)]

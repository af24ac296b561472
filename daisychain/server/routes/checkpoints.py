"""Checkpoint conversion over HTTP, for pages (a browser cannot write or safely read a .pt):

* ``POST /checkpoint/export`` — body: a state blob (``daisychain.engine.checkpoint``,
  ``encode_state``); answer: the ``.pt`` file (``Content-Disposition: attachment``).
* ``POST /checkpoint/import`` — body: a ``.pt`` file; optional header
  ``X-Daisy-Expected-Identity`` (base64 of the run identity JSON) to check it against the
  run; answer: the state blob, with ``X-Daisy-Params-Sha256``. The page then broadcasts the
  state to its room, where every peer checks the hash again before restoring.

The server keeps nothing: both routes are pure conversions. Bad input gets 400 with
``{"error": message}``; torch's weights-only loader means nothing in a file executes, and
the parser checks every declared size against the file before allocating
(``daisychain.engine.checkpoint``). Both go through the app's ``uploads.UploadGuard`` like
every upload: the body by ``guard.read_body`` (size checked against ``Content-Length``
first, a time limit, a cap on uploads at once), the conversion in its bounded parse pool
(per-address and total caps, a time limit). They keep nothing and show nothing of a room,
so they need no room credential.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging

from aiohttp import web

from daisychain.engine.checkpoint import (MAX_BYTES, MAX_JSON_DEPTH, CheckpointError,
                                          check_json_tree, decode_state, encode_state,
                                          load_checkpoint, save_checkpoint)
from daisychain.engine.trainer import run_id

from ..config import ServerConfig
from ..guard import refusal
from ..uploads import guard_of

LIMIT = min(MAX_BYTES, 64 * 2**20)
log = logging.getLogger("daisychain.server")


async def _body(request: web.Request) -> bytes:
    return await guard_of(request).body(request, LIMIT)


def _export(data: bytes, vocab: str | None = None):
    ck = decode_state(data)
    return ck, save_checkpoint(ck.identity, ck.step, ck.theta, ck.adam, vocab=vocab)


def _import(data: bytes, expected: dict | None):
    ck = load_checkpoint(data, expected)
    return ck, encode_state(ck.identity, ck.step, ck.theta, ck.adam)


def _bad(message: str, status: int = 400) -> web.HTTPException:
    return refusal(message, status)


def expected_identity(raw: str | None) -> dict | None:
    """The ``X-Daisy-Expected-Identity`` header: base64 of a JSON object, not nested deeper
    than the checkpoint parser allows. Raises HTTP 400 with the reason."""
    if not raw:
        return None
    try:
        text = base64.b64decode(raw, validate=True)
        expected = json.loads(text)
    except RecursionError:
        raise _bad(f"X-Daisy-Expected-Identity is nested deeper than {MAX_JSON_DEPTH} levels") \
            from None
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise _bad(f"X-Daisy-Expected-Identity is not base64 JSON: {str(exc)[:200]}") from None
    if not isinstance(expected, dict):
        raise _bad("X-Daisy-Expected-Identity is not base64 JSON: not an object")
    try:
        check_json_tree(expected, "X-Daisy-Expected-Identity")
    except CheckpointError as exc:
        raise _bad(str(exc)) from None
    return expected


def vocab_header(raw: str | None) -> str | None:
    """The ``X-Daisy-Vocab`` header: base64 of a JSON string, a text model's characters (the
    page's dataset ``meta.vocab``); checked against the model when the .pt is written."""
    if not raw:
        return None
    try:
        vocab = json.loads(base64.b64decode(raw, validate=True))
    except (ValueError, binascii.Error, UnicodeDecodeError, RecursionError) as exc:
        raise _bad(f"X-Daisy-Vocab is not base64 JSON: {str(exc)[:200]}") from None
    if not isinstance(vocab, str):
        raise _bad("X-Daisy-Vocab is not base64 JSON of a string")
    return vocab


async def export_checkpoint(request: web.Request) -> web.Response:
    vocab = vocab_header(request.headers.get("X-Daisy-Vocab"))
    data = await _body(request)
    try:
        ck, pt = await guard_of(request).work(request, _export, data, vocab)
    except CheckpointError as exc:
        raise _bad(str(exc)) from None
    except web.HTTPException:  # the guard's refusals (busy, too slow)
        raise
    except Exception as exc:  # noqa: BLE001 - a file we cannot read is a 400, never a 500
        log.exception("checkpoint conversion failed on a file it should have refused")
        raise _bad(f"cannot read this file ({type(exc).__name__}: {str(exc)[:200]})") from None
    name = f"daisychain-{run_id(ck.identity)}-step{ck.step}.pt"
    return web.Response(body=pt, content_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{name}"',
                                 "X-Daisy-Params-Sha256": ck.params_sha256})


async def import_checkpoint(request: web.Request) -> web.Response:
    expected = expected_identity(request.headers.get("X-Daisy-Expected-Identity"))
    data = await _body(request)
    try:
        ck, blob = await guard_of(request).work(request, _import, data, expected)
    except CheckpointError as exc:
        raise _bad(str(exc)) from None
    except web.HTTPException:  # the guard's refusals (busy, too slow)
        raise
    except Exception as exc:  # noqa: BLE001 - a file we cannot read is a 400, never a 500
        log.exception("checkpoint conversion failed on a file it should have refused")
        raise _bad(f"cannot read this file ({type(exc).__name__}: {str(exc)[:200]})") from None
    return web.Response(body=blob, content_type="application/octet-stream",
                        headers={"X-Daisy-Params-Sha256": ck.params_sha256,
                                 "X-Daisy-Step": str(ck.step)})


def checkpoint_routes(config: ServerConfig | None = None) -> list[web.AbstractRouteDef]:
    """The two routes; their limits come from the app's config (``create_app``)."""
    return [web.post("/checkpoint/export", export_checkpoint),
            web.post("/checkpoint/import", import_checkpoint)]

"""Checkpoint routes on the real server: state -> .pt -> state, and bad files refused."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import aiohttp
import torch

from daisychain.engine.checkpoint import decode_state, encode_state
from daisychain.engine.data import model_for, prepare_task
from daisychain.engine.spec import Hyper
from daisychain.engine.trainer import Trainer
from daisychain.server.routes.checkpoints import checkpoint_routes
from daisychain.units import load_luts
from aiohttp import web

from daisychain.server.app import create_app
from server_helpers import aio


def _trainer():
    ds = prepare_task("digits")
    tr = Trainer(model_for(ds, 8), Hyper(seed=2), ds, load_luts())
    for _ in range(3):
        tr.apply(tr.contribute(range(tr.hp.n_micro)).grad)
    return tr


@aio
async def test_export_import_roundtrip_and_refusals():
    tr = _trainer()
    blob = encode_state(tr.identity, tr.state.step, tr.theta, tr.state.adam)
    runner = web.AppRunner(create_app(extra_routes=checkpoint_routes()))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/"
    try:
        await _exercise(url, tr, blob)
    finally:
        await runner.cleanup()


async def _exercise(url, tr, blob):
    class srv:  # noqa: N801 - a tiny namespace
        pass
    srv.url = url
    async with aiohttp.ClientSession() as s:
        async with s.post(srv.url + "checkpoint/export", data=blob) as r:
            assert r.status == 200
            assert r.headers["X-Daisy-Params-Sha256"] == tr.params_sha256()
            assert ".pt" in r.headers["Content-Disposition"]
            pt = await r.read()
        assert torch.load(io.BytesIO(pt), weights_only=True)["step"] == 3
        ident = base64.b64encode(json.dumps(tr.identity).encode()).decode()
        async with s.post(srv.url + "checkpoint/import", data=pt,
                          headers={"X-Daisy-Expected-Identity": ident}) as r:
            assert r.status == 200
            back = decode_state(await r.read(), tr.identity)
        assert back.params_sha256 == tr.params_sha256() and back.step == 3
        other = base64.b64encode(json.dumps(dict(tr.identity, seed=99)).encode()).decode()
        async with s.post(srv.url + "checkpoint/import", data=pt,
                          headers={"X-Daisy-Expected-Identity": other}) as r:
            assert r.status == 400 and "seed" in (await r.json())["error"]
        async with s.post(srv.url + "checkpoint/import", data=b"garbage") as r:
            assert r.status == 400 and "weights-only" in (await r.json())["error"]
        bad = bytearray(blob)
        bad[8 + int.from_bytes(blob[4:8], "little") + 3] ^= 0x40  # a byte of theta
        async with s.post(srv.url + "checkpoint/export", data=bytes(bad)) as r:
            assert r.status == 400 and "hash mismatch" in (await r.json())["error"]
        async with s.get(srv.url + "healthz") as r:  # still serving
            assert r.status == 200


@aio
async def test_import_reads_a_body_sent_in_many_small_pieces():
    """Regression: the body was read with one StreamReader.read(n), which returns only what
    had arrived, so a .pt uploaded in several TCP pieces was cut short and refused."""
    tr = _trainer()
    from daisychain.engine.checkpoint import save_checkpoint
    pt = save_checkpoint(tr.identity, tr.state.step, tr.theta, tr.state.adam)

    async def trickle():
        for i in range(0, len(pt), 1000):
            yield pt[i:i + 1000]
            await asyncio.sleep(0.001)

    runner = web.AppRunner(create_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/"
    try:
        async with aiohttp.ClientSession() as s, s.post(url + "checkpoint/import", data=trickle()) as r:
            assert r.status == 200, await r.text()
            assert decode_state(await r.read()).params_sha256 == tr.params_sha256()
    finally:
        await runner.cleanup()


@aio
async def test_a_text_runs_download_carries_its_vocabulary():
    """The page's Download checkpoint of a text run had no ``vocab`` (issue 24: text models
    that leave lose their vocabulary): the page sends its dataset's characters in
    ``X-Daisy-Vocab``; the server checks them against the model and writes them in the .pt.
    A vocabulary that does not fit the model, or a header that is not base64 JSON of a
    string, is refused and nothing is written."""
    ds = prepare_task("text")
    tr = Trainer(model_for(ds, 8), Hyper(seed=2), ds, load_luts())
    blob = encode_state(tr.identity, tr.state.step, tr.theta, tr.state.adam)
    vocab = ds.meta["vocab"]

    def header(value) -> dict:
        return {"X-Daisy-Vocab": base64.b64encode(json.dumps(value).encode()).decode()}

    runner = web.AppRunner(create_app(extra_routes=checkpoint_routes()))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/checkpoint/export"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(url, data=blob, headers=header(vocab)) as r:
                assert r.status == 200, await r.text()
                pt = await r.read()
            assert torch.load(io.BytesIO(pt), weights_only=True)["vocab"] == vocab
            for bad in (vocab[:-1], vocab[:-1] + vocab[0], 7):
                async with s.post(url, data=blob, headers=header(bad)) as r:
                    assert r.status == 400, bad
                    assert "vocab" in (await r.json())["error"].lower()
            async with s.post(url, data=blob, headers={"X-Daisy-Vocab": "%%%"}) as r:
                assert r.status == 400 and "X-Daisy-Vocab" in (await r.json())["error"]
            async with s.post(url, data=blob) as r:  # without it: a .pt with no vocab, as before
                assert r.status == 200
                assert "vocab" not in torch.load(io.BytesIO(await r.read()), weights_only=True)
    finally:
        await runner.cleanup()

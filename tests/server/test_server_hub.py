"""``serve --hub`` (daisychain/server/routes/hub.py): a room's host names a Hugging Face data
set; the server reads its first rows through the same streaming reader as ``daisychain train
--stream`` and keeps the result for the room as an upload, under the same credential, rate
and quotas. The Hub is a local mirror folder of parquet files (``--hub-mirror``): nothing
downloads. Functional tier (a real loopback server)."""

from __future__ import annotations

import contextlib
import hashlib

import aiohttp
import pytest
from aiohttp import web

from daisychain.engine.data import prepare_task
from daisychain.engine.hub import HubStream
from daisychain.server.app import create_app
from daisychain.server.config import ServerConfig
from server_helpers import FAST, aio


def write_set(root, name="owner/stories", rows=200):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = root / name / "data"
    d.mkdir(parents=True)
    text = [f"story {i}: once upon a time a small robot counted {i * 3 % 11} sheep" for i in range(rows)]
    pq.write_table(pa.table({"text": text}), d / "train-00000-of-00001.parquet")
    return root / name


@contextlib.asynccontextmanager
async def server(**cfg):
    runner = web.AppRunner(create_app(ServerConfig(**{**FAST, **cfg, "host": "127.0.0.1", "port": 0})))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as s:
            yield s, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def member(s, base, room="new"):
    async with s.ws_connect(base.replace("http", "ws") + "/ws") as ws:
        await ws.send_json({"type": "hello", "version": 1, "name": "dev", "kind": "cpu",
                            "capacity": 1, "room": room})
        welcome = await ws.receive_json(timeout=10)
        room_msg = await ws.receive_json(timeout=10)
        yield {"X-Daisy-Token": welcome["token"]}, room_msg


@aio
async def test_a_hub_name_becomes_the_rooms_data_set_with_trains_fingerprint(tmp_path):
    path = write_set(tmp_path)
    ref = prepare_task("text", str(path), stream=HubStream(take=150))  # daisychain train --stream
    async with server(hub=True, hub_mirror=str(tmp_path)) as (s, base), member(s, base) as (cred, _):
        async with s.post(f"{base}/datasets/hub", params={"name": "owner/stories", "take": "150"},
                          headers=cred) as r:
            assert r.status == 200, await r.text()
            entry = await r.json()
        assert entry["fingerprint"] == ref.fingerprint and entry["origin"] == "upload"
        assert entry["name"] == "owner/stories"
        assert entry["train_args"] == ["--task", "text", "--data", str(path.resolve()), "--stream",
                                       "--take", "150"]
        async with s.get(f"{base}/datasets", headers=cred) as r:
            listed = (await r.json())["datasets"]
        assert any(d["fingerprint"] == ref.fingerprint for d in listed)
        async with s.get(f"{base}/data/text.dcds", params={"fingerprint": ref.fingerprint},
                         headers=cred) as r:
            assert hashlib.sha256(await r.read()).hexdigest() == ref.fingerprint
        async with s.get(f"{base}/datasets") as r:  # not to anyone outside the room
            assert all(d["fingerprint"] != ref.fingerprint for d in (await r.json())["datasets"])


@aio
async def test_hub_fetches_are_refused_in_words(tmp_path):
    write_set(tmp_path)
    async with server() as (s, base), member(s, base) as (cred, _):
        async with s.post(f"{base}/datasets/hub", params={"name": "owner/stories", "take": "5"},
                          headers=cred) as r:
            assert r.status == 403 and "daisychain serve --hub" in await r.text()
    async with server(hub=True, hub_mirror=str(tmp_path), hub_max_rows=100, room_upload_bytes=4000) as (s, base):
        async with s.post(f"{base}/datasets/hub", params={"name": "owner/stories", "take": "5"}) as r:
            assert r.status == 401  # no room credential
        async with member(s, base) as (cred, _):
            cases = [({"name": "../etc", "take": "5"}, 400, "owner/name"),
                     ({"name": "/etc/passwd", "take": "5"}, 400, "owner/name"),
                     ({"name": "owner/stories", "take": "0"}, 400, "must be a whole number"),
                     ({"name": "owner/stories", "take": "101"}, 413, "at most 100 rows"),
                     ({"name": "owner/stories", "take": "5", "task": "digits"}, 400, "text or image"),
                     ({"name": "owner/none", "take": "5"}, 400, "no such data set"),
                     ({"name": "owner/stories", "take": "5", "column": "body"}, 400, "no column 'body'"),
                     ({"name": "owner/stories", "take": "100"}, 413, "its limit is 4000")]
            for params, status, words in cases:
                async with s.post(f"{base}/datasets/hub", params=params, headers=cred) as r:
                    text = await r.text()
                    assert r.status == status and words in text, (params, r.status, text)
                    assert str(tmp_path) not in text  # the mirror's path is never shown
            async with s.get(f"{base}/datasets", headers=cred) as r:
                assert all(d["origin"] != "upload" for d in (await r.json())["datasets"])


def test_serve_hub_flags_reach_the_config():
    from daisychain.server.cli import add_arguments, config_from_args
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--hub", "--hub-max-rows", "500", "--hub-mirror", "/m"]))
    assert cfg.hub and cfg.hub_max_rows == 500 and cfg.hub_mirror == "/m"
    assert not config_from_args(p.parse_args([])).hub

"""``/checkpoint/import`` and ``/checkpoint/export`` against hostile files and uploads: a
stride-0 tensor standing for a large model, a deflate "zip bomb", uploads that never
finish, nested JSON. Each gets a 4xx with words; the server's memory stays bounded."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import select
import socket
import struct
import time
import zipfile

import numpy as np
import pytest
import torch

from daisychain.engine.adam import AdamState
from daisychain.engine.checkpoint import FORMAT, VERSION, save_checkpoint
from daisychain.engine.model import ParamLayout
from daisychain.engine.spec import ModelSpec
from daisychain.engine.trainer import params_sha256, run_id

from hostile import ATTACKER, MAX_RSS_GROWTH, MB, Bystander, ServerProcess, run, session

HYPER = {"lr": 0.003, "beta1": 0.9, "beta2": 0.999, "eps": 1e-08, "weight_decay": 0.0,
         "batch": 64, "micro_batch": 16, "grad_frac_bits": 40, "seed": 2}


def identity(*hidden: int) -> dict:
    widths = [64, *hidden, 10]
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [{"type": "linear", "in": a, "out": b}, {"type": "relu"}]
    model = {"input": {"kind": "dense", "dim": 64}, "classes": 10, "layers": layers[:-1]}
    return {"model": model, "hyper": HYPER, "dataset": "0" * 64, "task": "digits",
            "luts": "0" * 64, "engine": "1", "seed": 2}


def valid_pt(hidden: int = 8) -> bytes:
    ident = identity(hidden)
    n = ParamLayout(ModelSpec.from_json(ident["model"])).size
    z = np.zeros(n)
    return save_checkpoint(ident, 0, z, AdamState(z.copy(), z.copy(), 0, 1.0, 1.0))


def crafted_pt(ident: dict, tensor, extra: dict | None = None) -> bytes:
    """A checkpoint of ``ident`` whose every tensor is ``tensor(shape)``."""
    layout = ParamLayout(ModelSpec.from_json(ident["model"]))
    sd = {name: tensor(shape) for name, shape in zip(layout.names, layout.shapes)}
    obj = {"format": FORMAT, "version": VERSION, "identity": ident, "run_id": run_id(ident),
           "step": 0, "params_sha256": params_sha256(np.zeros(layout.size)), "state_dict": sd,
           "adam": {"m": sd, "v": sd, "step": 0, "b1t": 1.0, "b2t": 1.0}, **(extra or {})}
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def stride0(shape):
    return torch.zeros([1] * len(shape), dtype=torch.float64).expand(*shape)


def nested(depth: int):
    v: object = 1
    for _ in range(depth):
        v = {"a": v}
    return v


def nested_text(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("ckpt"))
    status, _ = run(post(s.url, "/checkpoint/import", valid_pt()))  # torch loaded: the baseline
    assert status == 200
    yield s
    s.stop()


async def _post(url, path, body, headers=None):
    async with session(ATTACKER) as s, s.post(url + path, data=body, headers=headers) as r:
        return r.status, (await r.read()).decode("utf-8", "replace")


def post(url, path, body, headers=None):
    return _post(url, path, body, headers)


def attack(srv, path, body, headers=None):
    """POST ``body`` while watching memory; the bystander checked after."""
    async def go():
        async with Bystander(srv.url) as by:
            with srv.watch() as w:
                status, text = await _post(srv.url, path, body, headers)
                await by.check()
            return status, text, w
    status, text, w = run(go())
    assert w["rss_growth"] < MAX_RSS_GROWTH, w
    assert w["peak_fds"] - w["fds0"] <= 16, w
    srv.assert_healthy()
    return status, json.loads(text)["error"] if text.startswith("{") else text


def test_stride_0_tensors_of_a_large_declared_model_are_refused(srv):
    """Regression: a few-KB file whose identity declares a large model, its tensors stride 0
    over one stored number, made the server allocate gigabytes."""
    ident = identity(20_000, 1000)  # 21.3 M parameters: 170 MB per float64 tensor set
    pt = crafted_pt(ident, stride0)
    assert len(pt) < 64 * 1024
    status, error = attack(srv, "/checkpoint/import", pt)
    assert status == 400 and "21311010 parameters" in error and "bytes" in error, error
    # a model that fits the file, but tensors that repeat one stored number: refused too
    pad = {"pad": torch.zeros(4096, dtype=torch.float64)}
    status, error = attack(srv, "/checkpoint/import", crafted_pt(identity(8), stride0, pad))
    assert status == 400 and "strides" in error, error


def test_a_deflated_zip_bomb_is_refused_before_inflating(srv):
    """Regression: a 230 KB checkpoint whose zip entries were deflated expanded to ~1.1 GB."""
    big = torch.zeros(30_000_000, dtype=torch.float64)  # 240 MB of zeros, deflated to ~250 KB
    raw = crafted_pt(identity(8), lambda s: torch.zeros(s, dtype=torch.float64), {"pad": big})
    del big
    bomb = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as src, \
            zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    del raw
    body = bomb.getvalue()
    assert len(body) < 2 * MB
    status, error = attack(srv, "/checkpoint/import", body)
    assert status == 400 and "compressed" in error, error


def test_nested_json_gets_a_400_with_words(srv):
    """Regression: an identity header of base64 JSON nested 3,000 deep gave an HTTP 500."""
    deep = base64.b64encode(("[" * 3000 + "]" * 3000).encode()).decode()  # fits a header
    status, error = attack(srv, "/checkpoint/import", valid_pt(),
                           {"X-Daisy-Expected-Identity": deep})
    assert status == 400 and "nested deeper than" in error, error
    # the same, inside the file's own identity
    ident = dict(identity(8), extra=nested(200))  # about as deep as torch.save will write
    pt = crafted_pt(ident, lambda s: torch.zeros(s, dtype=torch.float64))
    status, error = attack(srv, "/checkpoint/import", pt)
    assert status == 400 and "nested deeper than" in error, error
    # and in a state blob's header (export)
    head = ('{"identity": %s}' % nested_text(3000)).encode()
    status, error = attack(srv, "/checkpoint/export",
                           b"DCSV" + struct.pack("<I", len(head)) + head)
    assert status == 400 and "nested deeper than" in error, error


def test_odd_files_are_4xx_with_words(srv):
    legacy = io.BytesIO()
    torch.save({"format": FORMAT}, legacy, _use_new_zipfile_serialization=False)
    for body, words in ((legacy.getvalue(), "not a zip-format"),
                        (b"PK\x03\x04garbage", "broken zip"),
                        (b"", "not a zip-format")):
        status, error = attack(srv, "/checkpoint/import", body)
        assert status == 400 and words in error, (body[:20], error)
    head = b'{"identity": {"model": 1}, "step": 1e999}'
    status, error = attack(srv, "/checkpoint/export", b"DCSV" + struct.pack("<I", 10**6) + head)
    assert status == 400 and "declares" in error, error


def _stalled_uploads(port: int, n: int, length: int, send: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((ATTACKER, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(f"POST /checkpoint/import HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
                  f"\r\n".encode())
        s.setblocking(False)
        socks.append(s)
    left = {s: send for s in socks}
    chunk = b"\0" * (256 * 1024)
    end = time.monotonic() + 3
    while left and time.monotonic() < end:
        _, ready, _ = select.select([], list(left), [], 0.1)
        for s in ready:
            try:
                left[s] -= s.send(chunk[:left[s]])
            except OSError:
                left[s] = 0
            if left[s] <= 0:
                del left[s]
    return socks


def _status(s: socket.socket, timeout: float) -> int | None:
    s.setblocking(True)
    s.settimeout(timeout)
    try:
        head = s.recv(4096)
        return int(head.split()[1]) if head.startswith(b"HTTP/1.1") else None
    except (OSError, ValueError, IndexError):
        return None


def test_uploads_that_never_finish_are_capped_and_timed_out(serve):
    """Regression: 30 uploads that never finish held ~2 GB, with no timeout."""
    srv = serve("--body-timeout", "2", "--max-uploads", "2")

    async def go():
        async with Bystander(srv.url) as by:
            with srv.watch() as w:
                socks = await asyncio.to_thread(_stalled_uploads, srv.port, 30, 30_000_000, 8 * MB)
                await by.check()
                statuses = [await asyncio.to_thread(_status, s, 5) for s in socks]
                await by.check()
            for s in socks:
                s.close()
            return statuses, w
    statuses, w = run(go())
    assert w["rss_growth"] < MAX_RSS_GROWTH, w
    assert w["peak_fds"] - w["fds0"] <= 30 + 16, w
    assert statuses.count(503) >= 28 and statuses.count(408) <= 2, statuses
    assert set(statuses) <= {503, 408}, statuses
    status, text = run(post(srv.url, "/checkpoint/import", b"x",
                            {"Content-Length": str(100 * MB)}))
    assert status == 413 and "larger than the limit" in text
    srv.assert_healthy()

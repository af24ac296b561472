"""The text data windowed with another context (issue 38 item 4, the page's context slider):
``engine.data.with_context`` makes the data ``daisychain train --task text --context N`` makes
(same fingerprint) from any text set, and ``GET /data/text.dcds?context=N`` serves it, by its
own fingerprint too (a daisy-peer joining the run fetches it so); a bad N, or data that takes
none, is one line (400) and serves nothing."""

from __future__ import annotations

import hashlib

import pytest

from daisychain.engine.data import DataError, load_digits, prepare_task, with_context
from daisychain.server.routes.data import KEPT_CONTEXTS
from server_helpers import aio
from server_helpers import BOOK, room_host, server


@pytest.mark.parametrize("context", [1, 3, 8, 16, 100, 256])
def test_with_context_is_trains_data_for_that_context(context):
    want = prepare_task("text", context=context).fingerprint
    for base in (8, 5, 256):
        assert with_context(prepare_task("text", context=base), context).fingerprint == want


def test_with_context_refuses_in_words():
    text = prepare_task("text")
    for bad in (0, 257, True, 8.0):
        with pytest.raises(DataError, match=r"--context must lie in \[1, 256\]"):
            with_context(text, bad)
    with pytest.raises(DataError, match="applies to the text task"):
        with_context(load_digits(), 8)


async def _get(s, url, **kw):
    async with s.get(url, **kw) as r:
        return r.status, await r.read()


@aio
async def test_data_route_serves_the_text_with_a_context_and_keeps_it_by_fingerprint():
    async with server() as (s, base, _port):
        url = f"{base}/data/text.dcds"
        first = None
        for n in (16, *range(20, 20 + KEPT_CONTEXTS)):
            status, body = await _get(s, url, params={"context": str(n)})
            assert status == 200
            fp = hashlib.sha256(body).hexdigest()
            assert fp == prepare_task("text", context=n).fingerprint
            if first is None:
                first = fp  # a peer joining the run asks by fingerprint alone
                status, again = await _get(s, url, params={"fingerprint": fp})
                assert status == 200 and again == body
        # only the last KEPT_CONTEXTS are kept: the first is no longer served by fingerprint
        assert (await _get(s, url, params={"fingerprint": first}))[0] == 404
        for raw in ("0", "257", "1.5", "ten"):
            status, body = await _get(s, url, params={"context": raw})
            assert status == 400
            assert body.decode() == f"the context must be a whole number in [1, 256], not '{raw}'"
        status, body = await _get(s, f"{base}/data/digits.dcds", params={"context": "8"})
        assert status == 400 and b"applies to the text task" in body


@aio
async def test_an_uploads_text_with_a_context_is_trains_data_for_its_room_only(tmp_path, monkeypatch):
    (tmp_path / "book.txt").write_text(BOOK)
    monkeypatch.chdir(tmp_path)
    up = prepare_task("text", "book.txt")
    want = prepare_task("text", "book.txt", context=4).fingerprint  # train --data book.txt --context 4
    async with server() as (s, base, _port), room_host(s, base) as cred:
        async with s.post(f"{base}/datasets/upload", params={"name": "book.txt"},
                          data=BOOK.encode(), headers=cred) as r:
            assert r.status == 200, await r.text()
        q = {"fingerprint": up.fingerprint, "context": "4"}
        status, body = await _get(s, f"{base}/data/text.dcds", params=q, headers=cred)
        assert status == 200 and hashlib.sha256(body).hexdigest() == want
        assert (await _get(s, f"{base}/data/text.dcds", params=q))[0] == 404  # not a member

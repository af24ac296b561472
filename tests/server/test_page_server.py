"""The page's server routes on a real loopback server: /share (join links other devices can
reach), /share/qr.svg (segno), /datasets and uploads (a host's own .txt/.csv becomes the DCDS
``daisychain train --data`` makes, same fingerprint), ``serve --data``."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys

import segno

from daisychain.engine.data import prepare_task
from daisychain.server.routes.datasets import MAX_UPLOAD_BYTES
from daisychain.server.routes.share import lan_addresses

from server_helpers import BOOK, aio, room_host, server

CODE = "K7QM-4XZP-9R"
@aio
async def test_share_on_localhost_offers_lan_addresses_when_listening_on_them():
    lan = lan_addresses()
    async with server("0.0.0.0") as (s, base, port):
        async with s.get(f"{base}/share", params={"room": CODE}) as r:
            assert r.status == 200
            body = await r.json()
    urls = [link["url"] for link in body["links"]]
    assert not any("127.0.0.1" in u for u in urls) or not lan  # loopback only when nothing else
    for a in lan:
        assert f"http://{a}:{port}/?room={CODE}" in urls
    if lan:
        assert "JS units" in body["note"]


@aio
async def test_share_says_why_a_loopback_only_server_has_no_lan_link():
    async with server("127.0.0.1") as (s, base, port):
        async with s.get(f"{base}/share", params={"room": CODE}) as r:
            body = await r.json()
        assert [link["label"] for link in body["links"]] == ["this machine only"]
        assert "--host 0.0.0.0" in body["note"]
        async with s.get(f"{base}/share", params={"room": "not-a-code"}) as r:
            assert r.status == 400 and "room code" in await r.text()


@aio
async def test_qr_svg_is_segnos_code_of_the_room_link_and_nothing_else():
    async with server() as (s, base, port):
        origin = "http://10.0.0.5:8787"
        async with s.get(f"{base}/share/qr.svg", params={"room": CODE, "origin": origin}) as r:
            assert r.status == 200 and r.content_type == "image/svg+xml"
            svg = await r.read()
        want = io.BytesIO()
        segno.make(f"{origin}/?room={CODE}", error="m", micro=False).save(
            want, kind="svg", scale=6, border=2, dark="#111", light="#fff",
            title=f"QR code of {origin}/?room={CODE}")
        assert svg == want.getvalue()
        for bad in ("javascript:alert(1)", "http://x/evil/path", "http://a b", "ftp://x:1"):
            async with s.get(f"{base}/share/qr.svg", params={"room": CODE, "origin": bad}) as r:
                assert r.status == 400, bad


@aio
async def test_upload_makes_the_dcds_that_train_data_makes(tmp_path, monkeypatch):
    (tmp_path / "book.txt").write_text(BOOK)
    monkeypatch.chdir(tmp_path)
    ref = prepare_task("text", "book.txt")  # what `daisychain train --data book.txt` uses
    async with server() as (s, base, port), room_host(s, base) as cred:
        async with s.get(f"{base}/datasets") as r:
            before = (await r.json())["datasets"]
        assert [d["task"] for d in before] == ["digits", "text", "image"]
        async with s.post(f"{base}/datasets/upload", params={"name": "book.txt"},
                          data=BOOK.encode(), headers=cred) as r:
            assert r.status == 200, await r.text()
            entry = await r.json()
        assert entry["fingerprint"] == ref.fingerprint
        assert entry["train_args"] == ["--task", "text", "--data", "book.txt"]
        async with s.get(f"{base}/data/text.dcds", params={"fingerprint": ref.fingerprint},
                         headers=cred) as r:
            assert hashlib.sha256(await r.read()).hexdigest() == ref.fingerprint
        async with s.get(f"{base}/datasets", headers=cred) as r:
            after = (await r.json())["datasets"]
        assert after[-1]["fingerprint"] == ref.fingerprint and after[-1]["origin"] == "upload"


@aio
async def test_uploads_leave_nothing_in_the_datasets_cache():
    """Anyone on the LAN may upload: every distinct file used to add its Arrow cache to the
    Hugging Face cache for good (disk without bound). Now the cache lives and dies with the
    upload's temporary folder."""
    import datasets
    from pathlib import Path

    cache = Path(datasets.config.HF_DATASETS_CACHE)

    def files() -> set:
        return {p for p in cache.rglob("*") if p.is_file()} if cache.exists() else set()

    before = files()
    async with server() as (s, base, port), room_host(s, base) as cred:
        for i in range(3):
            body = (BOOK + f"\nupload number {i} of a hostile device\n").encode()
            async with s.post(f"{base}/datasets/upload", params={"name": f"u{i}.txt"},
                              data=body, headers=cred) as r:
                assert r.status == 200, await r.text()
    assert files() - before == set()


@aio
async def test_bad_uploads_are_refused_in_words_and_change_nothing(tmp_path):
    async with server() as (s, base, port), room_host(s, base) as cred:
        async def up(name, data, **q):
            async with s.post(f"{base}/datasets/upload", params={"name": name, **q}, data=data,
                              headers=cred) as r:
                return r.status, await r.text()

        st, text = await up("big.txt", b"a" * (MAX_UPLOAD_BYTES + 1))
        assert st == 413 and "limit" in text
        st, text = await up("../etc/passwd.txt", b"hello world " * 20)
        assert st == 400 and ".txt or .csv" in text
        st, text = await up("model.pt", b"hello world " * 20)
        assert st == 400
        st, text = await up("bin.txt", b"\xff\xfe" * 100)
        assert st == 400 and "UTF-8" in text
        st, text = await up("short.txt", b"hi")
        assert st == 400 and "characters" in text
        st, text = await up("table.csv", b"a,b\n" + b"x,y\n" * 50)
        assert st == 400 and "no column 'text'" in text and str(tmp_path) not in text
        st, text = await up("empty.txt", b"")
        assert st == 400
        async with s.get(f"{base}/datasets", headers=cred) as r:
            assert [d["origin"] for d in (await r.json())["datasets"]] == ["embedded"] * 3


@aio
async def test_server_datasets_are_listed_with_their_train_flags(tmp_path):
    src = tmp_path / "zen2.txt"
    src.write_text(BOOK)
    ds = prepare_task("text", str(src))
    async with server(datasets={str(src): ds}) as (s, base, port):
        async with s.get(f"{base}/datasets") as r:
            sets = (await r.json())["datasets"]
    served = [d for d in sets if d["origin"] == "server"]
    assert served == [{**served[0], "fingerprint": ds.fingerprint,
                       "train_args": ["--task", "text", "--data", str(src)]}]


def test_serve_data_refuses_an_unknown_source_in_words(tmp_path):
    out = subprocess.run([sys.executable, "-m", "daisychain.cli", "serve", "--port", "0",
                          "--data", str(tmp_path / "missing.txt")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--data" in out.stderr and "missing.txt" in out.stderr

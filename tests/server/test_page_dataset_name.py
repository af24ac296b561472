"""A data set the server was started with is shown to clients by its file name, never by the
server's path to it (issue 23, item 10)."""

from __future__ import annotations

from server_helpers import BOOK, aio, server

from daisychain.engine.data import prepare_task


@aio
async def test_a_server_data_set_is_named_by_its_file_name_not_its_path(tmp_path):
    src = tmp_path / "zen3.txt"
    src.write_text(BOOK)
    ds = prepare_task("text", str(src))
    async with server(datasets={str(src): ds}) as (s, base, port):
        async with s.get(f"{base}/datasets") as r:
            text = await r.text()
            sets = (await r.json())["datasets"]
    served = [d for d in sets if d["origin"] == "server"]
    assert [d["name"] for d in served] == ["zen3.txt"]
    assert str(tmp_path) not in served[0]["name"]

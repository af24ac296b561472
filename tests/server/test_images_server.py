"""Image sets through the server's existing data route on a real loopback server: the
embedded MNIST as /data/image.dcds, a host's ``serve --image-data`` set by fingerprint and
in /datasets with the train flags that make the same bytes."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np

from daisychain.engine.data import Dataset, prepare_task

from server_helpers import server
from server_helpers import aio


@aio
async def test_embedded_mnist_is_served_and_listed():
    ref = prepare_task("image")
    async with server() as (s, base, port):
        async with s.get(f"{base}/data/image.dcds") as r:
            assert r.status == 200
            body = await r.read()
            assert r.headers["X-Dataset-Fingerprint"] == ref.fingerprint
        async with s.get(f"{base}/datasets") as r:
            sets = (await r.json())["datasets"]
    assert hashlib.sha256(body).hexdigest() == ref.fingerprint
    ds = Dataset.from_bytes(body)
    assert ds.kind == "image" and ds.image_shape == (1, 28, 28)
    entry = next(d for d in sets if d["task"] == "image")
    assert entry["name"] == "MNIST handwritten digits (28x28)" and entry["train"] == 8000
    assert entry["train_args"] == ["--task", "image"]


@aio
async def test_server_image_set_by_fingerprint_with_its_flags(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "rgb.npz"
    np.savez_compressed(path, x_train=rng.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8),
                        y_train=np.arange(20) % 4, x_test=rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8),
                        y_test=np.arange(8) % 4)
    ds = prepare_task("image", str(path), image_size=16)
    async with server(datasets={str(path): ds}) as (s, base, port):
        async with s.get(f"{base}/data/image.dcds", params={"fingerprint": ds.fingerprint}) as r:
            assert hashlib.sha256(await r.read()).hexdigest() == ds.fingerprint
        async with s.get(f"{base}/datasets") as r:
            sets = (await r.json())["datasets"]
    served = [d for d in sets if d["origin"] == "server"]
    assert served[0]["train_args"] == ["--task", "image", "--data", str(path), "--image-size", "16"]
    assert Dataset.from_bytes(ds.to_bytes()).image_shape == (3, 16, 16)


def test_serve_image_data_refuses_bad_data_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "daisychain.cli", "serve", "--port", "0",
                          "--image-data", str(tmp_path / "missing.npz")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("daisychain serve: --image-data:")
    assert "missing.npz: no such file or folder" in lines[0]

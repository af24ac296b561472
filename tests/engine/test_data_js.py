"""Unit tier (node): webui/engine/data.js parses the DCDS bytes Python writes, the uint8
image kind included, and refuses hostile bytes with one DataError line before it allocates
what a header claims (a truncated float64 array used to escape as a DataView RangeError, and
a header claiming 20M float64 values allocated 160 MB before noticing the bytes were not there)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from daisychain.engine.data import Dataset
from daisychain.engine.spec import dumps_canonical
from jsrun import run_js


DRIVER = r"""
const out = [];
for (const hex of DATA) {
  try {
    const ds = parseDataset(Buffer.from(hex, "hex"));
    out.push({ kind: ds.kind, meta: ds.meta, x: Array.from(ds.x_train.data), xshape: ds.x_train.shape,
               type: ds.x_train.data.constructor.name, y: Array.from(ds.y_test.data) });
  } catch (e) { out.push({ error: `${e.name}: ${e.message}` }); }
}
console.log(JSON.stringify(out));
"""


def parse(blobs):
    return run_js(DRIVER, imports={"{ parseDataset }": "engine/data.js"}, data=[b.hex() for b in blobs],
                  timeout=120)


def with_header(ds: Dataset, edit) -> bytes:
    """ds's bytes with its header changed by edit(header)."""
    head = ds.header()
    edit(head)
    text = dumps_canonical(head).encode()
    body = ds.to_bytes()[8 + struct.unpack_from("<I", ds.to_bytes(), 4)[0]:]
    return b"DCDS" + struct.pack("<I", len(text)) + text + body


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_image_and_hostile_datasets():
    rng = np.random.default_rng(1)
    img = Dataset("img", rng.integers(0, 256, (3, 12), dtype=np.uint8), np.arange(3, dtype=np.int32),
                  rng.integers(0, 256, (2, 12), dtype=np.uint8), np.array([1, 0], np.int32), 3,
                  meta={"image_shape": [3, 2, 2]})
    dense = Dataset("d", rng.random((4, 3)), np.zeros(4, np.int32), rng.random((2, 3)), np.zeros(2, np.int32), 2)

    def claim(n):
        def edit(h):
            h["arrays"][0]["shape"] = [n]
        return edit

    blobs = [img.to_bytes(), dense.to_bytes()[:-8], with_header(dense, claim(20_000_000)),
             with_header(dense, claim(-4)), with_header(img, lambda h: h["arrays"][0].update(dtype="<f4")),
             img.to_bytes() + b"\0"]
    got = parse(blobs)
    assert got[0] == {"kind": "image", "meta": {"image_shape": [3, 2, 2]}, "x": img.x_train.ravel().tolist(),
                      "xshape": [3, 12], "type": "Uint8Array", "y": [1, 0]}
    assert got[1] == {"error": "DataError: dataset has missing bytes"}
    assert got[2] == {"error": "DataError: dataset has missing bytes"}
    assert got[3] == {"error": "DataError: array x_train: malformed shape [-4]"}
    assert got[4] == {"error": "DataError: array x_train: unsupported dtype <f4"}
    assert got[5] == {"error": "DataError: dataset has trailing or missing bytes"}

"""The plain-JS SHA-256 (pages outside a secure context have no crypto.subtle) against
Python's hashlib, run in Node on awkward lengths (block and padding boundaries)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from jsrun import run_js


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_js_sha256_equals_hashlib():
    rng = np.random.default_rng(1)
    lengths = [0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 1000, 65537]
    blobs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    got = run_js("""
const out = DATA.map(h => {
  const b = new Uint8Array(h.length / 2);
  for (let i = 0; i < b.length; i++) b[i] = parseInt(h.substr(2 * i, 2), 16);
  return Array.from(sha256Bytes(b), x => x.toString(16).padStart(2, "0")).join("");
});
console.log(JSON.stringify(out));
""", imports={"{ sha256Bytes }": "units/sha256.js"}, data=[b.hex() for b in blobs])
    assert got == [hashlib.sha256(b).hexdigest() for b in blobs]

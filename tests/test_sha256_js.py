"""The plain-JS SHA-256 (pages outside a secure context have no crypto.subtle) against
Python's hashlib, run in Node on awkward lengths (block and padding boundaries)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

WEBUI = Path(__file__).resolve().parents[1] / "daisychain" / "webui"


def test_js_sha256_equals_hashlib(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is required for the JS tests")
    rng = np.random.default_rng(1)
    lengths = [0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 1000, 65537]
    blobs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    (tmp_path / "in.json").write_text(json.dumps([b.hex() for b in blobs]))
    script = tmp_path / "run.mjs"
    script.write_text(f"""
import {{ readFileSync }} from "node:fs";
import {{ sha256Bytes }} from "{(WEBUI / 'sha256.js').as_uri()}";
const inputs = JSON.parse(readFileSync("{tmp_path / 'in.json'}", "utf8"));
const out = inputs.map(h => {{
  const b = new Uint8Array(h.length / 2);
  for (let i = 0; i < b.length; i++) b[i] = parseInt(h.substr(2 * i, 2), 16);
  return Array.from(sha256Bytes(b), x => x.toString(16).padStart(2, "0")).join("");
}});
console.log(JSON.stringify(out));
""")
    got = json.loads(subprocess.run([node, str(script)], capture_output=True, text=True,
                                    check=True).stdout)
    assert got == [hashlib.sha256(b).hexdigest() for b in blobs]

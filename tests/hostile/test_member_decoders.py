"""Hostile tier, the integer decoders a member's frames reach (issue 35, items 3 and 4), in
both languages, measured in a process of their own: a ~64 kB compressed contribution that
declares 11 million segment headers (66 MB inflated) is refused before anything it claims
is inflated or allocated, and -2**63 does not pass a bound. On d554184 the bomb took the
Python decoder's peak RSS up ~1 GB and node's ~1 GB (an object per header), and -2**63
decoded in Python.

    .venv/bin/python -m pytest tests/hostile/test_member_decoders.py -q
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from daisychain.peer import frames as F
from jsrun import run_js

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from attacker import _bomb  # noqa: E402

MB = 1 << 20
#: what a decoder may add to its process's peak RSS for one hostile body
MAX_GROWTH = 100 * MB
SIZE = 2410  # a contribution's values (the digits model's parameters)

PY = r"""
import base64, json, resource, sys
from daisychain.peer.intcodec import decode_ints
from daisychain.peer.framing import FrameError
body = base64.b64decode(sys.stdin.read())
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
try:
    decode_ints(3, body, %d)
    why = None
except FrameError as exc:
    why = str(exc)
print(json.dumps({"why": why, "growth": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before}))
""" % SIZE

JS = """
const body = new Uint8Array(Buffer.from(DATA.body, "base64"));
const before = process.resourceUsage().maxRSS * 1024;
let why = null;
try { await W.decodeInts(3, body, %d); } catch (err) { why = err.message; }
console.log(JSON.stringify({ why, growth: process.resourceUsage().maxRSS * 1024 - before }));
""" % SIZE


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return _bomb()


def test_a_segment_bomb_is_refused_before_it_is_inflated_in_python(bomb):
    assert len(bomb) < 100_000
    proc = subprocess.run([sys.executable, "-c", PY], input=base64.b64encode(bomb).decode(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["why"] == "integer body declares 11000000 segments (at most 8192)", out
    assert out["growth"] < MAX_GROWTH, out


def test_a_segment_bomb_is_refused_before_it_is_inflated_in_js(bomb, node):
    out = run_js(JS, imports={"W": "wire/intcodec.js"}, data={"body": base64.b64encode(bomb).decode()},
                 timeout=300)
    assert out["why"] == "integer body declares 11000000 segments (at most 8192)", out
    assert out["growth"] < MAX_GROWTH, out


@pytest.mark.parametrize("value", [-2**63, -2**63 + 1, 2**63 - 1, -2**53, 2**53])
def test_int64_extremes_are_refused_by_the_python_decoder(value):
    v = np.zeros(SIZE, "<i8")
    v[7] = value
    with pytest.raises(F.FrameError, match="not below 2"):
        F.decode_ints(F.Codec.RAW, v.tobytes(), SIZE)

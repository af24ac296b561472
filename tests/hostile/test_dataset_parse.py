"""Dataset bytes (DCDS) from a stranger: every malformed file is a DataError with words,
and nothing it declares is allocated beyond the file's own bytes."""

from __future__ import annotations

import json
import struct

import pytest

from daisychain.engine.data import DataError, Dataset


def dcds(head: bytes, body: bytes = b"") -> bytes:
    return b"DCDS" + struct.pack("<I", len(head)) + head + body


@pytest.mark.parametrize("data, words", [
    (dcds(b"[" * 3000 + b"]" * 3000), "malformed"),  # was a RecursionError
    (dcds(json.dumps({"task": "t", "classes": 2, "meta": {}, "arrays": [
        {"name": "x_train", "dtype": "<f8", "shape": [10**9, 10**9]}]}).encode()), "malformed"),
    (dcds(json.dumps({"task": "t", "classes": 2, "meta": {}, "arrays": [
        {"name": "x_train", "dtype": "<f8", "shape": [1 << 40]}]}).encode(), b"\0" * 64),
     "malformed"),
    (dcds(b'{"arrays": 1}'), "malformed"),
    (b"DCDS\xff\xff\xff\xff{}", "malformed"),
    (b"nope", "bad magic"),
])
def test_hostile_dataset_bytes_are_refused_with_words(data, words):
    with pytest.raises(DataError, match=words):
        Dataset.from_bytes(data)

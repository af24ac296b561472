"""What a ``--data`` value names (daisychain/engine/sources.py), and the text loader's clear
errors. What broke (issue 24): a missing ``nonexistent.txt`` said "Couldn't reach ... on the
Hub (OfflineModeIsEnabled)"; an empty or binary file said only "DatasetGenerationError";
``--data /tmp`` loaded the whole tree recursively."""

from __future__ import annotations

import pytest

from daisychain.engine.data import DataError, load_text
from daisychain.engine.sources import check_file, looks_like_path, source_kind


@pytest.mark.parametrize("name, is_path", [
    ("nonexistent.txt", True), ("./corpus", True), ("/data/x", True), ("~/x", True),
    ("../x", True), ("wikitext", False), ("roneneldan/TinyStories", False),
    ("bigcode/the-stack-v1.2", False), ("data/train.parquet", True),
])
def test_what_looks_like_a_path(name, is_path):
    assert looks_like_path(name) is is_path


def test_missing_file_does_not_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"^nonexistent.txt: the file does not exist$"):
        load_text("nonexistent.txt")
    assert source_kind("some/hub-name") == "hub"


def test_empty_binary_and_folder_are_refused_in_words(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    binary = tmp_path / "blob.csv"
    binary.write_bytes(bytes(range(256)) * 10)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9 ".encode("latin-1") * 100)
    with pytest.raises(DataError, match="the file is empty"):
        load_text(str(empty))
    with pytest.raises(DataError, match="a binary file, not text"):
        load_text(str(binary))
    with pytest.raises(DataError, match="not UTF-8 text"):
        load_text(str(latin))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("hello world " * 50)
    with pytest.raises(DataError, match="a folder; give one text file"):
        load_text(str(tmp_path))
    check_file(binary, text=False)  # another kind of data (npz, parquet) only needs bytes
    with pytest.raises(DataError, match="the file is empty"):
        check_file(empty, text=False)


def test_a_good_text_file_still_loads(tmp_path):
    f = tmp_path / "ok.txt"
    f.write_text("the quick brown fox jumps over the lazy dog\n" * 10)
    assert load_text(str(f), context=4).classes == len(set(f.read_text()))

"""``--data NAME --stream --take N`` (daisychain/engine/hub.py): the first N rows of a Hugging
Face data set, read in order through ``datasets.load_dataset(..., streaming=True)``, for the
text and the image task; the fingerprint names set, config, split, revision and count.
Here the set is a local folder of parquet files in the Hub's layout (the same code path; the
subprocesses run with HF_HUB_OFFLINE=1, so nothing can download). A name that cannot be had
gets one line. Unit and functional tiers (subprocesses, no network)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import daisychain as dc
from daisychain.engine.data import DataError, prepare_task
from daisychain.engine.hub import HubStream, hub_error

ROOT = Path(__file__).resolve().parents[2]
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def rows_text(n: int) -> list[str]:
    return [f"row {i:03d}: the quick brown fox jumps over the lazy dog, {i * 7 % 13} times" for i in range(n)]


@pytest.fixture
def text_set(tmp_path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "owner_textset"
    (d / "data").mkdir(parents=True)
    rows = rows_text(300)
    pq.write_table(pa.table({"text": rows[:150]}), d / "data" / "train-00000-of-00002.parquet")
    pq.write_table(pa.table({"text": rows[150:]}), d / "data" / "train-00001-of-00002.parquet")
    return d


@pytest.fixture
def image_set(tmp_path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    d = tmp_path / "owner_imageset"
    (d / "data").mkdir(parents=True)
    cells, labels = [], []
    for i in range(40):
        a = np.zeros((8, 8), np.uint8)
        a[i % 8, :] = 255
        a[:, (i * 3) % 8] = 128
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="PNG")
        cells.append({"bytes": buf.getvalue(), "path": None})
        labels.append(i % 4)
    pq.write_table(pa.table({"image": cells, "label": labels}), d / "data" / "train-00000-of-00001.parquet")
    return d


def cli(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daisychain.cli", "train", *argv], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=OFFLINE)


def test_text_stream_reads_the_first_rows_in_order(text_set):
    ds = prepare_task("text", str(text_set), stream=HubStream(take=170))
    assert ds.meta["hub"] == {"set": "owner_textset", "config": "default", "split": "train",
                              "revision": "local", "rows": 170}
    assert "first 170 rows (streamed)" in ds.meta["source"]
    again = prepare_task("text", str(text_set), stream=HubStream(take=170))
    assert again.fingerprint == ds.fingerprint  # deterministic
    more = prepare_task("text", str(text_set), stream=HubStream(take=171))
    assert more.fingerprint != ds.fingerprint  # the count is part of what was read
    vocab = ds.meta["vocab"]
    text = "".join(vocab[i] for i in ds.x_train[0]) + "".join(vocab[i] for i in ds.y_train[:40])
    assert text.startswith("row 000: the quick brown fox jumps over the")
    n_chars = len(ds.y_train) + len(ds.y_test) + ds.meta["context"]
    assert n_chars == len("\n".join(rows_text(170)))  # rows 0..169 and nothing more (both files)


def test_image_stream_reads_the_first_rows(image_set):
    ds = prepare_task("image", str(image_set), stream=HubStream(take=30))
    assert len(ds.y_train) + len(ds.y_test) == 30 and ds.image_shape == (1, 8, 8)
    assert ds.meta["hub"]["rows"] == 30 and ds.meta["hub"]["set"] == "owner_imageset"
    assert prepare_task("image", str(image_set), stream=HubStream(take=30)).fingerprint == ds.fingerprint


def test_stream_cli_and_api_give_one_hash(text_set, image_set):
    flags = ["--task", "text", "--data", str(text_set), "--stream", "--take", "120", "--steps", "3"]
    r = cli(*flags, "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    api = dc.train(None, str(text_set), task="text", stream=True, take=120, steps=3)
    assert api.params_sha256 == out["params_sha256"]
    img = ["--task", "image", "--data", str(image_set), "--stream", "--take", "30", "--steps", "2",
           "--layers", "conv4,pool,16", "--batch", "16", "--micro-batch", "4"]
    r = cli(*img, "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    api = dc.train("conv4,pool,16", str(image_set), task="image", stream=True, take=30, steps=2,
                   batch=16, micro_batch=4)
    assert api.params_sha256 == json.loads(r.stdout)["params_sha256"]


@pytest.mark.parametrize("argv, words", [
    (["--task", "text", "--data", "nosuch-owner/nosuch-set", "--stream", "--take", "5"],
     "nosuch-owner/nosuch-set: cannot reach the Hugging Face Hub"),
    (["--task", "text", "--take", "5"], "--take applies to --stream"),
    (["--task", "text", "--data", "x/y", "--stream"], "--stream needs --take N"),
    (["--task", "digits", "--stream", "--take", "5"], "--stream applies to the text and image tasks"),
    (["--task", "text", "--stream", "--take", "5"], "--stream reads a Hugging Face data set"),
    (["--task", "text", "--data", "x/y", "--stream", "--take", "0"], "--take must be a whole number"),
])
def test_stream_bad_input_gets_one_line(argv, words):
    r = cli(*argv, "--steps", "1")
    assert r.returncode == 2
    err = r.stderr.strip()
    assert "\n" not in err and words in err, err


def test_a_split_it_does_not_have_is_one_line(text_set):
    with pytest.raises(DataError) as err:
        prepare_task("text", str(text_set), stream=HubStream(take=5, split="test"))
    assert "\n" not in str(err.value) and "test" in str(err.value)


def _http_error(cls, message):
    """A real huggingface_hub error as the Hub client raises it (its response: headers only)."""
    response = SimpleNamespace(headers={}, request=None, status_code=403)
    return cls(message, response=response)


def test_hub_errors_in_one_line_each():
    from datasets.exceptions import DatasetNotFoundError
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    gated = hub_error(_http_error(GatedRepoError, "Access to dataset o/n is restricted"), "o/n")
    assert "a gated data set" in str(gated) and "hf auth login" in str(gated)
    gated2 = hub_error(DatasetNotFoundError("Dataset 'o/n' is a gated dataset on the Hub. You must "
                                            "be authenticated to access it."), "o/n")
    assert "a gated data set" in str(gated2)
    for exc in (_http_error(RepositoryNotFoundError, "404 Repository Not Found for url"),
                DatasetNotFoundError("Dataset 'o/n' doesn't exist on the Hub or cannot be accessed.")):
        assert "no such data set on the Hugging Face Hub" in str(hub_error(exc, "o/n"))
    assert "cannot reach the Hugging Face Hub" in str(hub_error(ConnectionError("Couldn't reach"), "o/n"))
    for e in (gated, gated2):
        assert "\n" not in str(e)


def test_demos_train_command_keeps_the_stream_flags(text_set):
    """``daisychain demo`` prints the train command of its run: --stream is a bare flag."""
    import argparse
    import shlex

    from daisychain.engine.settings import add_run_arguments, train_command

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    args = p.parse_args(["--task", "text", "--data", str(text_set), "--stream", "--take", "120",
                         "--steps", "3"])
    words = shlex.split(train_command(args))
    assert words[words.index("--stream") + 1] == "--take" and "120" in words
    r = cli(*words[2:], "--json", "--quiet")
    assert r.returncode == 0, r.stderr


ONLINE = """
import os, sys, json
from pathlib import Path
from daisychain.engine.data import load_text_source
from daisychain.engine.hub import _online
Path(sys.argv[1]).write_text("a small local text, long enough for the reader to take it " * 3)
load_text_source(sys.argv[1])  # a cached/local text read turns the offline switches on
import datasets.config, huggingface_hub.constants
seen = {"before": datasets.config.HF_HUB_OFFLINE}
with _online():
    seen["during"] = [datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE,
                      os.environ.get("HF_HUB_OFFLINE")]
seen["after"] = [datasets.config.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE")]
print(json.dumps(seen))
"""


@pytest.mark.parametrize("user_offline", [False, True])
def test_a_stream_lifts_only_the_offline_switch_daisychain_set(tmp_path, user_offline):
    """A process that read a cached text set (``--data`` without ``--stream``) turned Hugging
    Face offline; a later --stream read (the server's ``/datasets/hub``, a notebook) must not
    be refused for it. A user's own HF_HUB_OFFLINE=1 stays on."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    if user_offline:
        env["HF_HUB_OFFLINE"] = "1"
    r = subprocess.run([sys.executable, "-c", ONLINE, str(tmp_path / "t.txt")], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["before"] is True and seen["after"] == [True, "1"]
    assert seen["during"] == ([True, True, "1"] if user_offline else [False, False, None])

"""Unit tier, in node: the words and numbers of the page (daisychain/webui/page/ui_format.js).

The end card's command must be one a shell splits back into the flags `daisychain train`
reads, whatever the file's name; names replace device ids in every line."""

from __future__ import annotations

import shlex

import pytest

from jsrun import run_js

DRIVER = r"""
const cases = DATA;
const out = {
  commands: cases.commands.map((c) => F.trainCommand(c.identity, c.args, c.steps)),
  names: F.namesForIds(cases.names.text, cases.names.map),
  durations: cases.durations.map(F.duration),
  rates: cases.rates.map(F.stepRate),
  groups: F.codeGroups("K7QM-4XZP-9R"),
  counts: [F.count(1234567), F.count(NaN)],
};
console.log(JSON.stringify(out));
"""

MODEL = {"layers": [{"type": "embedding", "vocab": 24, "dim": 16},
                    {"type": "linear", "in": 128, "out": 16}, {"type": "relu"},
                    {"type": "linear", "in": 16, "out": 16}, {"type": "relu"},
                    {"type": "linear", "in": 16, "out": 24}]}
ONE = {"layers": [{"type": "linear", "in": 64, "out": 128}, {"type": "relu"},
                  {"type": "linear", "in": 128, "out": 10}]}
HYPER = {"lr": 0.003, "batch": 32, "micro_batch": 8, "seed": 3, "weight_decay": 0.0}


def run_driver(cases: dict) -> dict:
    return run_js(DRIVER, imports={"F": "page/ui_format.js"}, data=cases)


@pytest.fixture(scope="module")
def out():
    return run_driver({
        "commands": [
            {"identity": {"task": "text", "hyper": HYPER, "model": MODEL},
             "args": ["--task", "text", "--data", "it's my poem.txt"], "steps": 12},
            {"identity": {"task": "digits", "hyper": {**HYPER, "weight_decay": 0.01}, "model": ONE},
             "args": None, "steps": 600},
        ],
        "names": {"text": "'f2d3640e' is no other connected member; f2d3640e left",
                  "map": {"f2d3640e": "Phone", "ab": "too short to be an id"}},
        "durations": [4.25, 45, 125, 7384, -1],
        "rates": [12.34, 0.5, 0],
    })


def test_the_end_cards_command_splits_into_the_train_flags(out):
    text, digits = out["commands"]
    assert shlex.split(text) == [
        "daisychain", "train", "--task", "text", "--data", "it's my poem.txt", "--steps", "12",
        "--seed", "3", "--batch", "32", "--micro-batch", "8", "--lr", "0.003", "--layers", "16,16"]
    assert shlex.split(digits) == [
        "daisychain", "train", "--task", "digits", "--steps", "600", "--seed", "3", "--batch",
        "32", "--micro-batch", "8", "--lr", "0.003", "--weight-decay", "0.01", "--hidden", "128"]


def test_names_replace_ids_and_numbers_read_well(out):
    assert out["names"] == "'Phone' is no other connected member; Phone left"
    assert out["durations"] == ["4.3 s", "45 s", "2 min 05 s", "2 h 03 min", "—"]
    assert out["rates"] == ["12.3 steps/s", "30.0 steps/min", "—"]
    assert out["groups"] == ["K7QM", "4XZP", "9R"]
    assert out["counts"] == ["1,234,567", "—"]

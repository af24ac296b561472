"""Words that mislead (issue 36 item 8): each loss is named for what it is; the demo's "gets
no micro-batch of step N" comes once per peer (again only when it changes), not at every
step; a peer that computed nothing says why; `daisychain sample` stops at a word's end and
says how many characters it wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from daisychain.peer.node import print_summary

ROOT = Path(__file__).resolve().parents[2]


def _cli(*argv, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "daisychain.cli", *argv], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_train_names_the_test_accuracy_and_the_last_batchs_loss():
    r = _cli("train", "--steps", "3", "--hidden", "8", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "test accuracy: " in r.stdout and "(the test split)" in r.stdout
    assert "last training batch's loss: " in r.stdout, r.stdout


def test_the_demo_says_a_peer_gets_no_micro_batch_once():
    """2 replicas for 3 peers: one peer gets no task at every round; it was said every round."""
    r = _cli("demo", "--port", "0", "--peers", "3", "--steps", "8", "--hidden", "8", "--replicas", "2",
             "--sync-every", "2", "--seed", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if "gets no micro-batch" in ln]
    assert lines, r.stderr[-3000:]
    who = [ln.split(" gets no micro-batch")[0].split("\r")[-1].strip() for ln in lines]
    assert len(who) <= 2 * len(set(who)), lines  # once per peer (again only when the reason changed)
    assert "said once" in lines[0]
    assert "last training batch's loss" in r.stdout


def test_a_peer_that_computed_nothing_says_why(capsys):
    out = {"peers": [{"name": "b", "kind": "python", "micro_batches": 8}], "identity": {"hyper": {}},
           "accuracy": 0.17, "loss": 2.3, "steps": 4, "coordinated": True, "capacity": 6.5, "agreed": True,
           "params_sha256": "0" * 64,
           "units": {"run_micro_batches": 16, "mine_micro_batches": 0, "run": {}, "mine": {}}}
    out["units"]["run"] = out["units"]["mine"] = {"multiply": 0, "requantize": 0, "relu": 0}
    print_summary(out, False)
    text = capsys.readouterr().out
    assert "this peer (0 micro-batches: as the coordinator" in text, text
    assert "6.5 micro-batches/s" in text


def test_sample_stops_at_a_word_end_and_says_how_much_it_wrote(tmp_path):
    corpus = tmp_path / "words.txt"
    corpus.write_text("the cat sat on the mat and the dog ran far. " * 60)
    r = _cli("train", "--task", "text", "--data", str(corpus), "--context", "4", "--steps", "40", "--hidden", "32",
             "--quiet", "--save-checkpoint", "w.pt", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for length in ("10", "23", "37"):
        s = _cli("sample", "w.pt", "--prompt", "the ", "--length", length, "--temperature", "0", cwd=tmp_path)
        assert s.returncode == 0, s.stderr
        n = int(s.stderr.split("wrote ")[1].split()[0])
        assert n >= int(length) and f"--length {length}" in s.stderr
        text = s.stdout.rstrip("\n")
        # it ended a word: on punctuation, or on a space (dropped from the line), or said mid-word
        assert text[-1] in ".,;:!?" or n == len(text) - 4 + 1 or "mid-word" in s.stderr, (text, s.stderr)

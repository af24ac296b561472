"""Mesh tier: ``daisychain demo --task image`` (a server and three real daisy-peers over
aiortc, the image set fetched from the server's /data route as DCDS bytes, augmentation on)
ends on the hash of ``daisychain train`` with the same settings. Run inside the private
network namespace: ``scripts/in-netns.sh .venv/bin/python -m pytest tests/mesh -q``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--task", "image", "--image-size", "8", "--layers", "conv4,pool,16", "--steps", "4",
         "--batch", "32", "--micro-batch", "8", "--seed", "3", "--json", "--quiet"]

pytestmark = pytest.mark.mesh


def _json(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", *args, *SMALL],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_demo_image_three_peers_give_trains_hash():
    reference = _json(["train"])
    demo = _json(["demo", "--peers", "3", "--port", "0"])
    assert demo["all_agree"] and demo["params_sha256"] == reference["params_sha256"]
    assert demo["identity"]["hyper"]["augment_shift"] == 2
    assert demo["identity"]["dataset"] == reference["dataset_fingerprint"]

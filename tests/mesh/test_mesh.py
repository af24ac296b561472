"""Mesh tier: real ``daisy-peer`` processes, real aiortc data channels, the real server (with
the /data routes) on loopback. Run inside the private network namespace, where the peers
gather the veth addresses:

    scripts/in-netns.sh .venv/bin/python -m pytest tests/mesh -q

Each test trains the default digits run and checks every surviving peer prints the same
``params-sha256`` as the single-process reference trainer. No timing is asserted: a kill
or a join happens after the run is seen under way, and the runs are long enough for it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from daisychain import ENGINE_VERSION
from daisychain.engine.cli import train
from daisychain.engine.settings import add_run_arguments, settings_from_args
from peer_process import PeerProcess, server_thread
from daisychain.units.luts import read_manifest, write_luts

ROOT = Path(__file__).resolve().parents[2]
PEER = [sys.executable, "-c", "import sys; from daisychain.peer.cli import main; sys.exit(main())"]
LONG = 300  # steps: several seconds, so that a kill or a join lands mid-run


def reference(steps: int) -> str:
    import argparse
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return train(settings_from_args(p.parse_args(["--steps", str(steps)])), quiet=True)["params_sha256"]


@pytest.fixture(scope="module")
def server():
    """The real app on 127.0.0.1 in a thread of its own; yields the base URL."""
    with server_thread() as url:
        yield url


class Peer(PeerProcess):
    """A real daisy-peer process, its stderr in a file under $TMPDIR."""

    def __init__(self, server, *args, name):
        super().__init__(server, *args, name=name, err_dir=Path(os.environ.get("TMPDIR", "/tmp")))


@pytest.fixture
def peers():
    made = []

    def make(server, *args, name):
        p = Peer(server, *args, name=name)
        made.append(p)
        return p
    yield make
    for p in made:
        p.stop()


def host(peers, server, steps, wait, *extra):
    h = peers(server, "--create-room", "--approve", "all", "--wait-peers", str(wait),
              "--steps", str(steps), *extra, name="host")
    code = h.wait_for(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})").group(1)
    return h, code


def test_three_peers_train_to_the_reference_hash(server, peers):
    ref = reference(20)
    h, code = host(peers, server, 20, 2)
    members = [peers(server, "--room", code, name=f"m{i}") for i in (1, 2)]
    assert h.hash() == ref
    for m in members:
        assert m.hash() == ref


def test_json_summary_lists_every_peer(server, peers):
    h, code = host(peers, server, 20, 1, "--json")
    m = peers(server, "--room", code, "--json", name="m1")
    out = json.loads(m.finish()[1])
    assert out["params_sha256"] == reference(20) and out["steps"] == 20
    assert {p["kind"] for p in out["peers"]} == {"python"}
    assert sum(p["micro_batches"] for p in out["peers"]) == 20 * 4
    assert out["identity"]["engine"] == ENGINE_VERSION
    h.finish()


def test_killed_peer_mid_run_keeps_the_hash(server, peers):
    h, code = host(peers, server, LONG, 2)
    m1 = peers(server, "--room", code, name="m1")
    m2 = peers(server, "--room", code, name="m2")
    m2.wait_for("joined run")
    h.wait_for(r"train: +\d+%.*?\| *[1-9]\d*/")  # steps are being committed
    m2.kill()
    ref = reference(LONG)
    assert h.hash() == ref
    assert m1.hash() == ref
    assert "left" in h.stderr()


def test_host_leaves_mid_run_and_the_next_host_finishes(server, peers):
    h, code = host(peers, server, LONG, 2)
    m1 = peers(server, "--room", code, name="m1")
    m1.wait_for("joined run")
    m2 = peers(server, "--room", code, name="m2")
    m2.wait_for("joined run")
    m1.wait_for(r"train: +\d+%.*?\| *[1-9]\d*/")
    h.kill()
    ref = reference(LONG)
    assert m1.hash() == ref
    assert m2.hash() == ref
    assert "coordinating the run from step" in m1.stderr() + m2.stderr()


def test_late_joiner_syncs_and_ends_with_the_hash(server, peers):
    h, code = host(peers, server, LONG, 1)
    m1 = peers(server, "--room", code, name="m1")
    h.wait_for(r"train: +\d+%.*?\| *[1-9]\d*/")
    late = peers(server, "--room", code, name="late")
    late.wait_for(r"synced to step [1-9]")
    ref = reference(LONG)
    assert late.hash() == ref
    assert h.hash() == ref and m1.hash() == ref


def test_other_engine_version_is_refused(server, peers):
    h, code = host(peers, server, 20, 1)
    odd = peers(server, "--room", code, "--engine-version", "999", name="odd")
    rc, _ = odd.finish()
    assert rc == 1
    assert f"engine version: 999 here, {ENGINE_VERSION} in the run" in odd.stderr()
    h.wait_for("refused the run")
    good = peers(server, "--room", code, name="good")
    assert good.hash() == h.hash() == reference(20)


def test_other_lut_manifest_is_refused(server, peers, lut_copy):
    """A peer whose tables differ (a relu entry changed, manifest rehashed: a valid but
    different table set) is refused, naming the LUT manifest and its failed self-test."""
    manifest = read_manifest(lut_copy)
    tables = {}
    for name, u in {**manifest["units"], **manifest.get("extra_units", {})}.items():
        tables[name] = np.fromfile(lut_copy / u["file"], dtype=u["dtype"]).reshape(u["shape"])
    tables["relu"][200] = 5
    write_luts(tables, lut_copy, manifest.get("provenance"))
    h, code = host(peers, server, 20, 1)
    odd = peers(server, "--room", code, "--luts", str(lut_copy), name="odd")
    rc, _ = odd.finish()
    assert rc == 1
    err = odd.stderr()
    assert "LUT manifest:" in err and "self-test failed: relu unit" in err
    assert "refused the run" in h.wait_for("refused the run.*").group(0)
    good = peers(server, "--room", code, name="good")
    assert good.hash() == h.hash() == reference(20)

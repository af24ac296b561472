"""A tab hosts an image run (the real page and server, headless Chromium, the JS units):
mesh.start with the settings the page's form sends (hidden always set, no layers, no recipe
fields) must train the image task's default CNN with the image recipe's defaults, as
`daisychain train --task image` does, and the end card's command must remake that run.

It used to build a one-hidden-layer MLP from the form's `hidden` (modelFor(ds, layers ??
hidden)), without the recipe, and the end card's command named neither conv layers nor the
recipe flags."""

from __future__ import annotations

import argparse
import shlex

import pytest
from mesh_helpers import needs_netns

from daisychain.engine.cli import train
from daisychain.engine.counters import unit_counts
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.trainer import run_identity
from daisychain.units import load_luts

pytestmark = [pytest.mark.browser]

ROOM_OF = "window.__daisy.room"


def settings(*argv: str):
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return settings_from_args(p.parse_args(list(argv)))


def test_a_tab_hosts_the_default_image_run_to_trains_hash(browser_cpu, tabs):
    host = tabs(browser_cpu, "img-host").open("create=1")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    # what app.js readSettings sends for the image task with the form's defaults
    host.page.evaluate("""() => window.__daisy.mesh.start({ task: "image", steps: 2, seed: 7, batch: 64,
      micro_batch: 16, lr: 0.003, hidden: 128, layers: null, dataset: null })""")
    host.wait("window.__daisy.run.state === 'done'", 300_000)
    ident = host.state("window.__daisy.mesh.peer.identity")
    rs = settings("--task", "image", "--steps", "2", "--seed", "7", "--lr", "0.003")
    want = run_identity(rs.spec, rs.hp, rs.ds, load_luts())
    assert ident == want
    assert [l["type"] for l in ident["model"]["layers"]].count("conv2d") == 3
    assert ident["hyper"]["augment_shift"] == 2 and ident["hyper"]["lr_decay_steps"] == 2
    assert host.state("window.__daisy.run.sha") == train(rs, quiet=True)["params_sha256"]
    # the page's unit counters count the convolutions (counters.py's formula)
    c = host.state("window.__daisy.mesh.counters()")
    assert c["micro"] == 8 and {k: c[k] for k in ("multiply", "requantize", "relu")} == unit_counts(rs.spec, 16, 8)
    host.wait("document.querySelector('#end-command').textContent.startsWith('daisychain train')")
    words = shlex.split(host.page.inner_text("#end-command"))
    again = settings(*words[2:])
    assert run_identity(again.spec, again.hp, again.ds, load_luts()) == want, words

    # the host resumes its own state to step 3 with the same form settings: the recipe is the
    # checkpoint's (decay at step 2), not the defaults of a 3-step run (decay at 3: another run)
    host.page.evaluate("""async () => { const m = window.__daisy.mesh; const st = await m.snapshot();
      await m.start({ task: "image", steps: 3, seed: 7, batch: 64, micro_batch: 16, lr: 0.003, hidden: 128,
        layers: null, dataset: null }, st); }""")
    host.wait("window.__daisy.run.state === 'done' && window.__daisy.run.step === 3", 300_000)
    rs3 = settings("--task", "image", "--steps", "3", "--seed", "7", "--lr", "0.003", "--lr-decay-steps", "2")
    assert host.state("window.__daisy.mesh.peer.identity") == want
    assert host.state("window.__daisy.run.sha") == train(rs3, quiet=True)["params_sha256"]


def test_a_run_started_without_a_learning_rate_takes_the_tasks_as_train_does(browser_cpu, tabs):
    """mesh.start with only the task and steps is `daisychain train --task image --steps 2`:
    the image task's learning rate (0.006), not digits' 0.003 (prepareRun's default was
    0.003 for every task, so bench/tab_rooms.py's rooms ended on another hash than train's)."""
    host = tabs(browser_cpu, "img-host-lr").open("create=1")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    host.page.evaluate("""() => window.__daisy.mesh.start({ task: "image", steps: 2 })""")
    host.wait("window.__daisy.run.state === 'done'", 300_000)
    rs = settings("--task", "image", "--steps", "2")
    assert rs.hp.lr == 0.006
    assert host.state("window.__daisy.mesh.peer.identity") == run_identity(rs.spec, rs.hp, rs.ds, load_luts())
    assert host.state("window.__daisy.run.sha") == train(rs, quiet=True)["params_sha256"]


@needs_netns
def test_a_tab_and_a_daisy_peer_join_a_tab_hosted_image_run(browser_cpu, tabs, server_url):
    """Two tabs and a daisy-peer split an image run with the recipe (shifts follow the batch
    slot, whoever computes it): every replica ends on train's hash."""
    from test_mixed_room import DaisyPeer, _approve_all

    host = tabs(browser_cpu, "img-host2").open("create=1")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    code = host.state(f"{ROOM_OF}.code")
    guest = tabs(browser_cpu, "img-guest").open(f"room={code}")
    peer = DaisyPeer(server_url, code, "py-img", capacity=5)
    try:
        _approve_all(host, ["img-guest", "py-img"])
        host.wait(f"{ROOM_OF}.members.length === 3")
        host.wait("Object.values(window.__daisy.links).filter((s) => s === 'open').length === 2", 60_000)
        host.page.evaluate("""() => window.__daisy.mesh.start({ task: "image", steps: 3, seed: 4, batch: 32,
          micro_batch: 4, lr: 0.01, hidden: 128, layers: ["conv4", "pool", 16], dataset: null,
          lr_warmup: 1, lr_decay_steps: 5 })""")
        for t in (host, guest):
            t.wait("window.__daisy.run.state === 'done'", 300_000)
        result = peer.result()
    finally:
        peer.kill()
    rs = settings("--task", "image", "--steps", "3", "--seed", "4", "--batch", "32", "--micro-batch", "4",
                  "--lr", "0.01", "--layers", "conv4,pool,16", "--lr-warmup", "1", "--lr-decay-steps", "5")
    assert rs.hp.augment_shift == 2
    want = train(rs, quiet=True)["params_sha256"]
    for t in (host, guest):
        run = t.state("window.__daisy.run")
        assert run["agreed"] is True and run["sha"] == want, t.name
    assert result["params_sha256"] == want and result["agreed"]
    # the work was split (the shares follow measured capacities: who got how much varies)
    done = host.state("window.__daisy.run.done")
    assert sum(done.values()) == 3 * 8 and len([n for n in done.values() if n > 0]) >= 2, done

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

from daisychain.engine.cli import train
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

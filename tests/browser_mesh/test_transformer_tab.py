"""A tab trains the text transformer (issue 37) in the real page (mesh.start, the compute
workers, the JS units): a tab alone ends on `daisychain train --layers block16h2,block16h2`'s
hash with train's run identity (its exp_lut too) and the unit counters count the exp unit;
a tab and a daisy-peer split the same run and both end on that hash."""

from __future__ import annotations

import argparse

import pytest
from mesh_helpers import needs_netns

from daisychain.engine.cli import train
from daisychain.engine.counters import unit_counts
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.trainer import run_identity
from daisychain.units import load_luts

pytestmark = [pytest.mark.browser]

ROOM_OF = "window.__daisy.room"
LAYERS = "block16h2,block16h2"


def settings(*argv: str):
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return settings_from_args(p.parse_args(list(argv)))


def test_a_tab_trains_the_transformer_to_trains_hash(browser_cpu, tabs):
    host = tabs(browser_cpu, "gpt-host").open("create=1")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    host.page.evaluate("""() => window.__daisy.mesh.start({ task: "text", steps: 3, seed: 7, batch: 64,
      micro_batch: 16, lr: 0.003, hidden: 128, layers: ["block16h2", "block16h2"], dataset: null })""")
    host.wait("window.__daisy.run.state === 'done'", 300_000)
    rs = settings("--task", "text", "--steps", "3", "--seed", "7", "--layers", LAYERS)
    want = run_identity(rs.spec, rs.hp, rs.ds, load_luts())
    assert host.state("window.__daisy.mesh.peer.identity") == want and "exp_lut" in want
    assert host.state("window.__daisy.run.sha") == train(rs, quiet=True)["params_sha256"]
    c = host.state("window.__daisy.mesh.counters()")
    assert c["micro"] == 12
    assert {k: c[k] for k in ("multiply", "requantize", "relu", "exp")} == unit_counts(rs.spec, 16, 12)
    host.wait("!document.querySelector('#count-exp-row').hidden")
    assert host.page.get_attribute("#count-exp", "data-value") == str(c["exp"])


@needs_netns
def test_a_tab_and_a_daisy_peer_split_a_transformer_run(browser_cpu, tabs, server_url):
    from test_mixed_room import DaisyPeer, _approve_all

    host = tabs(browser_cpu, "gpt-host2").open("create=1")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    code = host.state(f"{ROOM_OF}.code")
    # train's run first: it compiles the transformer's loops into numba's disk cache, so the
    # peer's first tasks do not wait seconds for a compile (on a clean clone, under load, the
    # tab's backups then answered all of them first and the peer computed none)
    rs = settings("--task", "text", "--steps", "3", "--seed", "4", "--batch", "32", "--micro-batch", "4",
                  "--layers", LAYERS)
    want = train(rs, quiet=True)["params_sha256"]
    # a tab measures ~50 micro-batches/s of 4 samples on this model: the peer claims as much
    peer = DaisyPeer(server_url, code, "py-gpt", capacity=50)
    try:
        _approve_all(host, ["py-gpt"])
        host.wait(f"{ROOM_OF}.members.length === 2")
        host.wait("Object.values(window.__daisy.links).filter((s) => s === 'open').length === 1", 60_000)
        host.page.evaluate("""() => window.__daisy.mesh.start({ task: "text", steps: 3, seed: 4, batch: 32,
          micro_batch: 4, lr: 0.003, hidden: 128, layers: ["block16h2", "block16h2"], dataset: null })""")
        host.wait("window.__daisy.run.state === 'done'", 300_000)
        result = peer.result()
    finally:
        peer.kill()
    run = host.state("window.__daisy.run")
    assert run["agreed"] is True and run["sha"] == want
    assert result["params_sha256"] == want and result["agreed"]
    done = host.state("window.__daisy.run.done")
    assert sum(done.values()) == 3 * 8 and len([n for n in done.values() if n > 0]) >= 2, done


def test_the_form_refuses_bad_blocks_in_pythons_words(browser_cpu, tabs):
    """--layers blockWhH in the page's form: a width the heads do not divide is refused next
    to the field with the words of `daisychain train`; blocks on the digits task too."""
    from daisychain.engine.data import model_for, prepare_task
    from daisychain.engine.settings import parse_layers
    from daisychain.engine.spec import SpecError

    with pytest.raises(SpecError) as exc:
        model_for(prepare_task("text"), parse_layers("block16h3"))
    host = tabs(browser_cpu, "gpt-form").open()
    host.page.click("#create-room")
    host.wait("window.__daisy.room && window.__daisy.room.isHost")
    host.page.select_option("#f-task", "text")
    host.page.fill("#settings [name=layers]", "block16h3")
    host.page.click("#start")
    host.wait("document.querySelector('#err-layers').textContent !== ''", 60_000)
    assert host.page.inner_text("#err-layers") == str(exc.value) == "layer 2: width 16 is not divisible by 3 heads"
    assert host.state("window.__daisy.run.state") == "idle"
    host.page.select_option("#f-task", "digits")
    host.page.fill("#settings [name=layers]", "block16h2")
    host.page.click("#start")
    host.wait("document.querySelector('#err-layers').textContent.includes('transformer')", 60_000)
    assert host.page.inner_text("#err-layers") == "transformer blocks read a text (task text), not the digits task"


def test_a_transformer_checkpoint_downloads_and_resumes_in_a_fresh_tab(browser_cpu, tabs, tmp_path):
    """A tab trains block16h2 for 2 steps and downloads a .pt (torch.load reads it, the block's
    tensors named as the spec names them); a fresh host tab uploads it, its form takes the
    blocks, and trains on to step 4: `daisychain train --steps 4`'s hash."""
    import torch
    from test_checkpoints import _upload

    h1 = tabs(browser_cpu, "gpt-ck-a").open("create=1")
    h1.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    h1.page.evaluate("""() => window.__daisy.mesh.start({ task: "text", steps: 2, seed: 5, batch: 32,
      micro_batch: 8, lr: 0.003, hidden: 128, layers: ["block16h2"], dataset: null })""")
    h1.wait("window.__daisy.run.state === 'done'", 300_000)
    with h1.page.expect_download() as dl:
        h1.page.click("#download-checkpoint")
    pt = tmp_path / dl.value.suggested_filename
    dl.value.save_as(pt)
    obj = torch.load(pt, weights_only=True)
    args = ("--task", "text", "--seed", "5", "--batch", "32", "--micro-batch", "8", "--layers", "block16h2")
    rs2 = settings("--steps", "2", *args)
    assert obj["step"] == 2 and obj["params_sha256"] == train(rs2, quiet=True)["params_sha256"]
    assert [(k, tuple(v.shape)) for k, v in obj["state_dict"].items()] == rs2.spec.param_shapes()
    h2 = tabs(browser_cpu, "gpt-ck-b").open("create=1")
    h2.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    got = _upload(h2, pt)
    assert got["error"] is None and got["loaded"]["step"] == 2, got
    assert h2.page.input_value("#settings [name=layers]") == "block16h2"
    h2.page.fill("#settings input[name=steps]", "4")
    h2.page.click("#start")
    h2.wait("window.__daisy.run.state === 'done' && window.__daisy.run.step === 4", 300_000)
    assert h2.state("window.__daisy.run.sha") == train(settings("--steps", "4", *args), quiet=True)["params_sha256"]

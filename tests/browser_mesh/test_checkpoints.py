"""Checkpoints in the page, on the real server with real Chromium tabs (and, for the restore
broadcast, a real daisy-peer over WebRTC):

* a tab downloads a .pt that ``torch.load(weights_only=True)`` reads, with the tab's hash;
* a fresh host tab uploads it and trains on: the hash of the uninterrupted run;
* corrupt, other-run and malicious files are refused in words and change nothing;
* a host tab restores a running room: another tab and a daisy-peer load the state, and the
  run goes on to the hash of ``daisychain train`` and of ``daisy-peer --resume`` from the file.

The default model (hidden 128): its STATE is several frames, so a tab that cut one message
with the frames of the next (each message sent from its own loop) fails here.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mesh_helpers import log, needs_netns

from daisychain.engine.checkpoint import load_checkpoint, save_checkpoint
from daisychain.engine.cli import train
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.trainer import Trainer
from daisychain.peer import frames as F
from daisychain.units import load_luts

pytestmark = [pytest.mark.browser]

ROOM_OF = "window.__daisy.room"
CK = "window.__daisy.checkpoint"
S = dict(task="digits", seed=7, batch=64, micro_batch=16, lr=0.003, hidden=128)  # the default model
BIN = Path(sys.executable).parent


def _args(steps: int, **over) -> list[str]:
    s = {**S, **over}
    return ["--task", s["task"], "--steps", str(steps), "--seed", str(s["seed"]), "--batch",
            str(s["batch"]), "--micro-batch", str(s["micro_batch"]), "--lr", str(s["lr"]),
            "--hidden", str(s["hidden"])]


def _settings(steps: int, **over):
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return settings_from_args(p.parse_args(_args(steps, **over)))


def reference(steps: int) -> str:
    return train(_settings(steps), quiet=True)["params_sha256"]


def pt_at(steps: int, **over) -> bytes:
    """The .pt of the run after `steps` steps, made by the Python engine."""
    rs = _settings(steps, **over)
    tr = Trainer(rs.spec, rs.hp, rs.ds, load_luts())
    for _ in range(steps):
        tr.apply(tr.contribute(range(tr.hp.n_micro)).grad)
    return save_checkpoint(tr.identity, steps, tr.theta, tr.state.adam)


def _host_room(tabs, browser, name):
    host = tabs(browser, name).open("create=1")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    return host, host.state(f"{ROOM_OF}.code")


def _fill(host, steps: int, **over) -> None:
    s = {**S, **over, "steps": steps}
    host.page.select_option("#settings select[name=task]", s["task"])
    for key in ("steps", "seed", "batch", "micro_batch", "lr", "hidden"):
        host.page.fill(f"#settings input[name={key}]", str(s[key]))


def _upload(tab, path: Path) -> dict:
    """Choose a file in the upload input; returns window.__daisy.checkpoint once it is handled."""
    tab.wait("!document.querySelector('#upload-checkpoint').disabled")
    tab.page.set_input_files("#upload-checkpoint", str(path))
    tab.wait(f"!{CK}.busy", 60_000)
    return tab.state(f"({{error: {CK}.error, info: {CK}.info, restores: {CK}.restores, "
                     f"loaded: {CK}.loaded && {{step: {CK}.loaded.step, sha: {CK}.loaded.params_sha256}}}})")


def test_download_resume_and_refusals_in_a_tab(browser_cpu, tabs, tmp_path):
    # (a) a tab trains 6 steps and downloads its state as a .pt
    h1, _ = _host_room(tabs, browser_cpu, "ck-a")
    _fill(h1, 6)
    h1.page.click("#start")
    h1.wait("window.__daisy.run.state === 'done'", 120_000)
    sha6 = h1.state("window.__daisy.run.sha")
    assert sha6 == reference(6)
    with h1.page.expect_download() as dl:
        h1.page.click("#download-checkpoint")
    name = dl.value.suggested_filename
    run_id = h1.state("window.__daisy.run.runId")
    assert name == f"daisychain-{run_id}-step6.pt"
    pt = tmp_path / name
    dl.value.save_as(pt)
    obj = torch.load(pt, weights_only=True)
    assert obj["params_sha256"] == sha6 and obj["step"] == 6 and obj["run_id"] == run_id
    model = torch.nn.Sequential(torch.nn.Linear(64, S["hidden"]), torch.nn.ReLU(), torch.nn.Linear(S["hidden"], 10)).double()
    model.load_state_dict({k.replace("layers.", ""): v for k, v in obj["state_dict"].items()})
    assert load_checkpoint(pt.read_bytes()).adam.step == 6
    assert "Saved" in h1.page.inner_text("#checkpoint-info")

    # (b) a fresh host tab uploads it and trains on to step 14: the uninterrupted hash
    h2, _ = _host_room(tabs, browser_cpu, "ck-b")
    got = _upload(h2, pt)
    assert got["error"] is None and got["loaded"] == {"step": 6, "sha": sha6}, got
    assert h2.page.input_value("#settings input[name=seed]") == "7"
    assert h2.page.input_value("#settings input[name=hidden]") == str(S["hidden"])
    h2.page.fill("#settings input[name=steps]", "14")
    h2.page.click("#start")
    h2.wait("window.__daisy.run.state === 'done'", 120_000)
    sha14 = h2.state("window.__daisy.run.sha")
    assert sha14 == reference(14)
    assert h2.state("window.__daisy.run.step") == 14

    # (c) bad files: refused in words, the room's state unchanged
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(pt.read_bytes()[: 3000])
    other = tmp_path / "other-run.pt"
    other.write_bytes(pt_at(2, seed=99))
    evil = tmp_path / "evil.pt"
    buf = io.BytesIO()
    torch.save({"format": "daisychain-checkpoint", "x": _Evil()}, buf)
    evil.write_bytes(buf.getvalue())
    for path, words in ((corrupt, "weights-only"), (other, "seed: 7 here, 99 in the checkpoint"),
                        (evil, "weights-only")):
        got = _upload(h2, path)
        assert got["error"] and words in got["error"] and "Nothing was changed" in got["error"], got
        assert path.name in h2.page.inner_text("#checkpoint-error")
        assert h2.state("window.__daisy.run.sha") == sha14 and h2.state("window.__daisy.run.step") == 14
        assert got["restores"] == []
    assert not PWNED.exists()

    # and a good file restores the finished run, which goes on to the steps set again
    got = _upload(h2, pt)
    assert got["error"] is None and len(got["restores"]) == 1, got
    h2.wait("window.__daisy.run.state === 'done' && window.__daisy.run.step === 14", 120_000)
    assert h2.state("window.__daisy.run.sha") == sha14


PWNED = Path(f"/tmp/daisychain-test-pwned-{os.getpid()}")


class _Evil:
    """Unpickling this would create PWNED."""

    def __reduce__(self):
        return (os.system, (f"touch {PWNED}",))


class DaisyPeer:
    """A daisy-peer process whose stderr goes to a file (read while it runs)."""

    def __init__(self, server_url: str, code: str, name: str, tmp_path: Path):
        self.name = name
        self.err_path = tmp_path / f"{name}.err"
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen(
            [str(BIN / "daisy-peer"), "--server", server_url, "--room", code, "--name", name,
             "--capacity", "60", "--json", "--quiet"], stdout=subprocess.PIPE, stderr=self.err, text=True)

    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if re.search(pattern, self.stderr()):
                return
            assert self.proc.poll() is None, f"{self.name} exited:\n{self.stderr()[-2000:]}"
            time.sleep(0.1)
        raise AssertionError(f"{self.name}: no {pattern!r} in\n{self.stderr()[-2000:]}")

    def result(self, timeout: float = 180) -> dict:
        out, _ = self.proc.communicate(timeout=timeout)
        for line in self.stderr().splitlines():
            log.info("[%s] %s", self.name, line)
        assert self.proc.returncode == 0, f"{self.name} exited {self.proc.returncode}: {self.stderr()[-2000:]}"
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.err.close()


@needs_netns
def test_restore_reaches_a_tab_and_a_daisy_peer(browser_cpu, tabs, server_url, tmp_path):
    """(d) The host tab restores the running room to step 10: the member tab and the
    daisy-peer load it (a bad file first changes nothing); the run goes on and, stopped at
    step S, every replica holds the hash of `daisychain train --steps S` and of
    `daisy-peer --resume step10.pt --steps S`. The default model: the STATE is several frames."""
    ck = tmp_path / "step10.pt"
    ck.write_bytes(pt_at(10))
    c = load_checkpoint(ck.read_bytes())
    assert len(F.encode_state(c.theta, c.adam.m, c.adam.v, c.adam.b1t, c.adam.b2t)) > 2 * F.MAX_CHUNK
    host, code = _host_room(tabs, browser_cpu, "ck-host")
    member = tabs(browser_cpu, "ck-tab").open(f"room={code}")
    peer = DaisyPeer(server_url, code, "ck-py", tmp_path)
    try:
        for name in ("ck-tab", "ck-py"):
            sel = f"#approvals li[data-peer]:has-text('{name}') button.approve"
            host.page.wait_for_selector(sel, timeout=120_000)
            host.page.click(sel)
        host.wait("Object.values(window.__daisy.links).filter((s) => s === 'open').length === 2", 60_000)
        _fill(host, 100000)
        host.page.click("#start")
        host.wait("window.__daisy.run.step >= 12", 120_000)
        member.wait("window.__daisy.run.step >= 1", 60_000)
        assert member.state(f"{CK}.restores") == []

        other = tmp_path / "other.pt"
        other.write_bytes(pt_at(1, hidden=16))
        got = _upload(host, other)
        assert got["error"] and "model spec differs" in got["error"] and got["restores"] == [], got

        got = _upload(host, ck)
        assert got["error"] is None and got["restores"][0]["step"] == 10, got
        member.wait(f"{CK}.restores.length === 1", 60_000)
        assert member.state(f"{CK}.restores")[0]["step"] == 10
        peer.wait_for(r"restored from a checkpoint by \S+: step 10")
        host.wait("window.__daisy.run.step >= 16", 120_000)  # training goes on after it
        host.page.click("#stop")
        for t in (host, member):
            t.wait("window.__daisy.run.state === 'done'", 120_000)
        res = peer.result()
    finally:
        peer.kill()
    steps = host.state("window.__daisy.run.step")
    want = reference(steps)
    for t in (host, member):
        run = t.state("window.__daisy.run")
        assert run["sha"] == want and run["agreed"] is True, (t.name, run)
    assert res["params_sha256"] == want and res["steps"] == steps and res["agreed"]
    assert [r["step"] for r in res["restores"]] == [10]
    # the same file resumed by a daisy-peer alone, to the same step: the same hash
    alone = subprocess.run([str(BIN / "daisy-peer"), "--server", server_url, "--create-room",
                            "--approve", "none", "--resume", str(ck), *_args(steps), "--json",
                            "--quiet"], capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert json.loads(alone.stdout.strip().splitlines()[-1])["params_sha256"] == want


def test_a_cluster_checkpoint_resumes_in_a_tab(browser_cpu, tabs, tmp_path):
    """Issue 12: a checkpoint made by `daisychain cluster` (one rank, started by the
    environment variables torchrun would set) is uploaded into a browser room and trained
    on there, to the hash of the uninterrupted run."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ck = tmp_path / "cluster-step6.pt"
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="1", RANK="0")
    r = subprocess.run([sys.executable, "-m", "daisychain.cluster", "--quiet", *_args(6),
                        "--save-checkpoint", str(ck)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    sha6 = reference(6)
    assert f"params-sha256: {sha6}" in r.stdout + r.stderr
    host, _ = _host_room(tabs, browser_cpu, "ck-cluster")
    got = _upload(host, ck)
    assert got["error"] is None and got["loaded"] == {"step": 6, "sha": sha6}, got
    host.page.fill("#settings input[name=steps]", "10")
    host.page.click("#start")
    host.wait("window.__daisy.run.state === 'done'", 120_000)
    assert host.state("window.__daisy.run.step") == 10
    assert host.state("window.__daisy.run.sha") == reference(10)

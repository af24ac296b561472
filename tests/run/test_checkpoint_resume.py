"""Checkpoints in a run: the restore broadcast of the run protocol (sans-IO, every message
through the real frame codec), and real ``daisy-peer`` processes over real aiortc data
channels (``--loopback``) saving a ``.pt`` and resuming from it.

The rule under test: stopping at step N, saving, and resuming to N+M ends on the same
``params-sha256`` as training N+M steps without a stop; a restore reaches every replica; a
bad state or a file of another run changes nothing.
"""

from __future__ import annotations

import argparse
import base64
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from daisychain.engine.checkpoint import (CheckpointError, load_checkpoint, read_checkpoint_file,
                                          save_checkpoint)
from daisychain.engine.cli import train
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.engine.trainer import Trainer, params_sha256
from daisychain.peer import frames as F
from daisychain.peer import run as R
from jsrun import run_js
from peer_process import PeerProcess, server_thread
from daisychain.units import load_luts
from run_net import STEPS, Net

ROOT = Path(__file__).resolve().parents[2]
PEER = [sys.executable, "-c", "import sys; from daisychain.peer.cli import main; sys.exit(main())"]
RUN = ["--hidden", "32", "--seed", "5"]  # a small digits run: a step takes milliseconds


def run_settings(steps: int, *argv: str):
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return settings_from_args(p.parse_args(["--steps", str(steps), *argv]))


def reference(steps: int, *argv: str) -> str:
    return train(run_settings(steps, *argv), quiet=True)["params_sha256"]


def trained(steps: int, *argv: str) -> Trainer:
    rs = run_settings(max(steps, 1), *argv)  # a run has >= 1 step; the Trainer does `steps` here
    tr = Trainer(rs.spec, rs.hp, rs.ds, load_luts())
    for _ in range(steps):
        tr.apply(tr.contribute(range(tr.hp.n_micro)).grad)
    return tr


# -- the restore broadcast, sans-IO ---------------------------------------------------------


@pytest.fixture(scope="module")
def rs():
    return run_settings(STEPS)


def test_restore_reaches_every_member_and_the_run_goes_on(rs):
    """p0 restores the room to step 2 while everyone is at step 4: every replica loads the
    state (members that are ahead too), and the run ends where an uninterrupted one does."""
    ck = trained(2)
    ck_adam = ck.state.adam
    state = {"done": False}

    def hook(net):
        if not state["done"] and net.peers["p0"].step == 4 and not net.computes:
            net.feed("p0", net.peers["p0"].restore(2, ck.theta, ck_adam, ck.params_sha256()))
            state["done"] = True
            return True
        return False

    net = Net(rs, 3)
    net.run(hook)
    assert state["done"]
    for pid in ("p0", "p1", "p2"):
        r = net.of(R.Restored, pid)
        assert len(r) == 1 and r[0].step == 2 and r[0].params_sha256 == ck.params_sha256()
        assert net.of(R.Ended, pid)[0].params_sha256 == reference(STEPS)
    assert net.peers["p0"].term == 2
    # steps 2 and 3 were committed twice: before the restore and after it
    assert [c.step for c in net.of(R.Committed, "p0")] == [0, 1, 2, 3, 2, 3, 4, 5]


def test_restore_to_a_later_step_and_a_late_joiner(rs):
    """A restore ahead of the run (a checkpoint of step 5) and a peer that joins after it."""
    ck = trained(5)
    net = Net(rs, 2)
    net.feed("p0", net.peers["p0"].restore(5, ck.theta, ck.state.adam))
    net.add("p9")
    net.run()
    for pid in ("p0", "p1", "p9"):
        assert net.of(R.Ended, pid)[0].params_sha256 == reference(STEPS)
    assert [c.step for c in net.of(R.Committed, "p9")] == [5]


def test_a_bad_restore_state_changes_nothing(rs):
    """A member checks the hash before loading: a STATE that does not hash to its meta, or
    that is not the announced checkpoint, is refused loudly and the replica is unchanged."""
    net = Net(rs, 2)
    p1 = net.peers["p1"]
    for _ in range(50):  # p1 joined and holds the run
        if not net.pump_wire():
            break
    before = p1.trainer.params_sha256()
    good = trained(3)
    st = good.state
    bad_theta = st.theta.copy()
    bad_theta[7] += 1e-6
    term = p1.term + 1
    msgs = [F.Restore(term, 3, good.params_sha256()),
            F.State(3, good.params_sha256(), bad_theta, st.adam.m, st.adam.v, st.adam.b1t, st.adam.b2t)]
    out = [o for m in msgs for o in p1.receive("p0", m)]
    assert any(isinstance(o, R.Log) and o.loud and "does not match its hash" in o.text for o in out)
    assert p1.trainer.params_sha256() == before and p1.step == 0
    other = trained(1)
    ost = other.state
    msgs = [F.Restore(term + 1, 3, good.params_sha256()),
            F.State(1, other.params_sha256(), ost.theta, ost.adam.m, ost.adam.v, ost.adam.b1t, ost.adam.b2t)]
    out = [o for m in msgs for o in p1.receive("p0", m)]
    assert any(isinstance(o, R.Log) and o.loud and "not the announced checkpoint" in o.text for o in out)
    assert p1.trainer.params_sha256() == before and not any(isinstance(o, R.Restored) for o in out)
    # a restore from a member that does not coordinate is ignored
    assert isinstance(p1.receive("p5", F.Restore(term + 9, 3, good.params_sha256()))[0], R.Log)
    assert p1.member.restoring is None


def test_the_coordinator_checks_the_state_it_restores(rs):
    net = Net(rs, 2)
    p0 = net.peers["p0"]
    before = p0.trainer.params_sha256()
    good = trained(2)
    with pytest.raises(R.RestoreError, match="hash"):
        p0.restore(2, good.theta, good.state.adam, "0" * 64)
    with pytest.raises(R.RestoreError, match="parameters"):
        p0.restore(2, good.theta[:-1], good.state.adam)
    nan = good.theta.copy()
    nan[0] = np.nan
    with pytest.raises(R.RestoreError, match="non-finite"):
        p0.restore(2, nan, good.state.adam)
    with pytest.raises(R.RestoreError, match="only the coordinator"):
        net.peers["p1"].restore(2, good.theta, good.state.adam)
    assert p0.trainer.params_sha256() == before and p0.step == 0


def test_restore_frames_in_both_languages():
    """The `restore` control message round-trips through the Python codec (the JS mirror is
    decoded by the tab tests)."""
    m = F.to_message(F.Restore(4, 17, "ab" * 32), "5cdcf52855fbe0d4")
    r = F.Reassembler()
    got = [r.feed(fr) for fr in F.encode_frames(m, 3)][-1]
    assert F.from_message(got) == F.Restore(4, 17, "ab" * 32)
    bad = F.Message(F.FrameType.CONTROL, "", 1, {"t": "restore", "term": 1, "params_sha256": "xyz"})
    with pytest.raises(F.FrameError, match="restore"):
        F.from_message(bad)


# -- files ------------------------------------------------------------------------------------


def test_checkpoint_of_a_page_identity_has_the_run_id(tmp_path):
    """A page's identity says weight_decay 0 (a JSON integer): the .pt still names the run id."""
    tr = trained(1, *RUN)
    ident = dict(tr.identity, hyper={**tr.identity["hyper"], "weight_decay": 0, "lr": 0.003})
    obj = torch.load(__import__("io").BytesIO(save_checkpoint(ident, 1, tr.theta, tr.state.adam)),
                     weights_only=True)
    assert obj["run_id"] == tr.run_id


def test_read_checkpoint_file_names_the_run_settings(tmp_path):
    tr = trained(2, *RUN)
    path = tmp_path / "a.pt"
    path.write_bytes(save_checkpoint(tr.identity, 2, tr.theta, tr.state.adam))
    other = Trainer(*_spec_hp_ds(run_settings(2, "--hidden", "32", "--seed", "6")), load_luts())
    with pytest.raises(CheckpointError) as err:
        read_checkpoint_file(path, other.identity)
    assert "seed: 6 here, 5 in the checkpoint" in str(err.value)
    assert "--hidden 32 --seed 5" in str(err.value)
    with pytest.raises(CheckpointError, match="cannot read"):
        read_checkpoint_file(tmp_path / "missing.pt")


def _spec_hp_ds(s):
    return s.spec, s.hp, s.ds


# -- real daisy-peers -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    """The real app on 127.0.0.1 in a thread of its own; yields the base URL."""
    with server_thread() as url:
        yield url


class Peer(PeerProcess):
    """A real daisy-peer process (loopback ICE), its stderr in a file."""

    def __init__(self, server, tmp_path, *args, name):
        super().__init__(server, "--loopback", "--quiet", *args, name=name, err_dir=tmp_path)


@pytest.fixture
def peers(server, tmp_path):
    made = []

    def make(*args, name):
        p = Peer(server, tmp_path, *args, name=name)
        made.append(p)
        return p
    yield make
    for p in made:
        p.stop()


def host(peers, steps, wait, *extra):
    h = peers("--create-room", "--approve", "all", "--wait-peers", str(wait), "--steps", str(steps),
              *RUN, *extra, name="host")
    return h, h.wait_for(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})").group(1)


def test_save_and_resume_end_on_the_uninterrupted_hash(peers, tmp_path):
    """N steps with --save-checkpoint, then --resume to N+M with a member: the same hash as
    N+M steps in one go; the member's own --save-checkpoint holds that state too."""
    n, total = 8, 20
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    h, code = host(peers, n, 1, "--save-checkpoint", str(a))
    m = peers("--room", code, name="m1")
    assert h.hash() == m.hash() == reference(n, *RUN)
    obj = torch.load(a, weights_only=True)  # a plain torch checkpoint
    assert obj["step"] == n and obj["params_sha256"] == reference(n, *RUN)
    assert set(obj["state_dict"]) == {"layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"}

    h2, code2 = host(peers, total, 1, "--resume", str(a))
    m2 = peers("--room", code2, "--save-checkpoint", str(b), name="m2")
    want = reference(total, *RUN)
    assert h2.hash() == want and m2.hash() == want
    assert "resuming run" in h2.stderr()
    ck = load_checkpoint(b.read_bytes())
    assert ck.step == total and ck.params_sha256 == want


def test_ctrl_c_saves_the_state_and_it_resumes(peers, tmp_path):
    """SIGINT mid-run: the host writes its state (a whole step, never half of one) and
    leaves; resuming from the file ends on the uninterrupted hash."""
    a = tmp_path / "stopped.pt"
    h, _ = host(peers, 100000, 0, "--save-checkpoint", str(a), "--save-every", "7")
    deadline = time.monotonic() + 60
    while not a.exists() and time.monotonic() < deadline:  # the first autosave (step 7)
        time.sleep(0.05)
    assert a.exists(), h.stderr()[-2000:]
    h.proc.send_signal(signal.SIGINT)
    rc, _ = h.finish(120)  # (on a timeout, finish() shows every thread's stack: SIGUSR1)
    assert rc == 130, h.stderr()[-2000:]
    assert "state saved to" in h.stderr()
    ck = read_checkpoint_file(a)
    assert ck.step >= 7 and ck.params_sha256 == params_sha256(ck.theta)
    total = ck.step + 3
    h2, _ = host(peers, total, 0, "--resume", str(a))
    assert h2.hash() == reference(total, *RUN)


def test_resume_refuses_a_file_of_another_run(peers, tmp_path):
    tr = trained(2, *RUN)
    a = tmp_path / "other.pt"
    a.write_bytes(save_checkpoint(tr.identity, 2, tr.theta, tr.state.adam))
    bad = peers("--create-room", "--approve", "all", "--steps", "5", "--hidden", "32", "--seed", "9",
                "--resume", str(a), name="host")
    rc, _ = bad.finish()
    err = bad.stderr()
    assert rc == 1 and "cannot resume" in err and "seed: 9 here, 5 in the checkpoint" in err, err
    assert "--seed 5" in err  # the settings that would match the file
    evil = tmp_path / "evil.pt"
    evil.write_bytes(b"\x80\x04cos\nsystem\n(S'touch " + str(tmp_path / "pwned").encode() + b"'\ntR.")
    bad = peers("--create-room", "--steps", "5", *RUN, "--resume", str(evil), name="host2")
    rc, _ = bad.finish()
    assert rc == 1 and "weights-only" in bad.stderr()
    assert not (tmp_path / "pwned").exists()
    rc, _ = peers("--room", "AAAA-AAAA-AA", "--resume", str(a), name="m").finish()
    assert rc == 2


# -- the JS side in node: the state blob and a tab member's restore ----------------------------

JS_DRIVER = r"""
const input = DATA;
const f64 = (a) => Float64Array.from(a);
const out = {};
// a page's state blob, at step 0 (b1t = b2t = 1, written by JSON as 1)
const snap = { identity: input.identity, step: 0, theta: f64(input.theta), m: f64(input.m),
  v: f64(input.v), b1t: 1, b2t: 1 };
out.blob = Buffer.from(await C.encodeState(snap)).toString("base64");
const back = await C.decodeState(Buffer.from(input.pyblob, "base64"));
out.decoded = { step: back.step, sha: back.params_sha256, b1t: back.b1t, theta0: back.theta[0] };
try { await C.decodeState(Buffer.from(input.badblob, "base64")); out.bad = null; } catch (e) { out.bad = e.message; }
// a tab member holding step 0 gets restore + a bad STATE, then restore + the good one
const n = input.theta.length;
// (a replica as the run sees it through the engine seam: its size, load and snapshot, which
// the member's rollback window takes when it loads a state)
const tr = { theta: f64(input.theta), adam: { m: new Float64Array(n), v: new Float64Array(n), b1t: 1, b2t: 1, step: 0 }, step: 0,
  layout: { size: n },
  snapshot() { return { step: this.step, theta: this.theta.slice(), m: this.adam.m.slice(), v: this.adam.v.slice(), b1t: this.adam.b1t, b2t: this.adam.b2t }; },
  load(st) { this.theta.set(st.theta); this.adam.m.set(st.m); this.adam.v.set(st.v); Object.assign(this.adam, { b1t: st.b1t, b2t: st.b2t, step: st.step }); this.step = st.step; } };
const peer = new RunPeer("p1", {});
peer.host = "p0";
Object.assign(peer.member, { trainer: tr, term: 1, run: { run_id: "0".repeat(16) } });
const good = { T: "state", step: back.step, params_sha256: back.params_sha256, theta: back.theta, m: back.m,
  v: back.v, b1t: back.b1t, b2t: back.b2t };
const before = await paramsSha256(tr.theta);
const restore = { T: "restore", term: 2, step: back.step, params_sha256: back.params_sha256 };
const badTheta = back.theta.slice(); badTheta[3] += 1e-6;
let o = [...await peer.receive("p0", restore), ...await peer.receive("p0", { ...good, theta: badTheta })];
out.badState = { logs: o.filter((x) => x.kind === "log" && x.loud).map((x) => x.text), restored: o.some((x) => x.kind === "restored"),
  same: (await paramsSha256(tr.theta)) === before };
o = await peer.receive("p9", { ...restore, term: 3 });
out.stranger = o.map((x) => x.text);
o = [...await peer.receive("p0", { ...restore, term: 3 }), ...await peer.receive("p0", good)];
out.goodState = { restored: o.filter((x) => x.kind === "restored"), sha: await paramsSha256(tr.theta), step: tr.step, term: peer.term };
console.log(JSON.stringify(out));
"""


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_js_state_blob_and_tab_member_restore():
    """checkpoint.js writes blobs Python reads (b1t = 1 written as the JSON integer 1) and
    reads Python's; webui/run/ loads a restored STATE only if it is the announced one and
    hashes right, and only from the coordinator."""
    from daisychain.engine.checkpoint import decode_state, encode_state

    fresh = trained(0, *RUN)
    at3 = trained(3, *RUN)
    pyblob = encode_state(at3.identity, 3, at3.theta, at3.state.adam)
    bad = bytearray(pyblob)  # one bit of theta flipped: the header's hash no longer fits
    bad[8 + int.from_bytes(pyblob[4:8], "little") + 5] ^= 0x10
    z = np.zeros(fresh.theta.size)
    payload = {"identity": dict(fresh.identity, hyper={**fresh.identity["hyper"], "weight_decay": 0}),
               "theta": fresh.theta.tolist(), "m": z.tolist(), "v": z.tolist(),
               "pyblob": base64.b64encode(pyblob).decode(),
               "badblob": base64.b64encode(bytes(bad)).decode()}
    out = run_js(JS_DRIVER, imports={"C": "engine/checkpoint.js", "{ RunPeer }": "run/index.js",
                                     "{ paramsSha256 }": "engine/trainer.js"}, data=payload)
    ck = decode_state(base64.b64decode(out["blob"]), fresh.identity)
    assert ck.params_sha256 == fresh.params_sha256() and ck.adam.b1t == 1.0 and ck.step == 0
    assert out["decoded"] == {"step": 3, "sha": at3.params_sha256(), "b1t": at3.state.adam.b1t,
                              "theta0": float(at3.theta[0])}
    assert out["bad"] and "hash mismatch" in out["bad"]
    assert out["badState"]["same"] and not out["badState"]["restored"]
    assert any("does not match its hash" in t for t in out["badState"]["logs"])
    assert any("does not coordinate" in t for t in out["stranger"])
    assert out["goodState"]["sha"] == at3.params_sha256() and out["goodState"]["step"] == 3
    assert out["goodState"]["restored"][0]["by"] == "p0" and out["goodState"]["term"] == 3

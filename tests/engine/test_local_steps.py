"""Exact local steps (daisychain/engine/local.py): ``--replicas R --sync-every H``.

The rules under test: R == H == 1 is today's synchronous run (same identity, same hash); a
local-steps run's hash does not depend on how simulated workers share the replicas and each
inner step's micro-batches, nor on a stop and resume from a checkpoint mid-run; a round is
the documented arithmetic (each replica on the synchronous schedule's steps (n*H + h)*R + j,
its own inner Adam moments, then the integer sum of the quantized deltas and the Nesterov
outer step); bad values are refused in one line.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from daisychain.engine.adam import AdamState, adam_step
from daisychain.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from daisychain.engine.cli import train
from daisychain.engine.detmath import pow2
from daisychain.engine.local import (DELTA_FRAC_BITS, LocalTrainer, make_trainer, pack_moments,
                                     unpack_moments)
from daisychain.engine.spec import Hyper, SpecError
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts
from local_cases import LOCAL, LOCAL_SHA, TINY, settings, sha

ROOT = Path(__file__).resolve().parents[2]

def test_the_synchronous_run_keeps_its_identity():
    """R == H == 1: none of the four fields is in the identity JSON, whatever the outer
    settings, and the trainer is the synchronous one."""
    plain = Hyper().to_json()
    assert not {"replicas", "sync_every", "outer_lr", "outer_momentum"} & set(plain)
    assert Hyper(outer_lr=0.3, outer_momentum=0.0).to_json() == plain
    local = Hyper(replicas=2).to_json()
    assert local["replicas"] == 2 and local["sync_every"] == 1 and local["outer_lr"] == 1.0 and local["outer_momentum"] == 0.5
    assert Hyper(**local) == Hyper(replicas=2)
    rs = settings(2, *TINY)
    assert type(make_trainer(rs.spec, rs.hp, rs.ds, load_luts())) is Trainer
    assert train(rs, quiet=True)["identity"]["hyper"] == plain | {"batch": 16, "micro_batch": 4,
                                                                   "seed": 3}


def test_workers_and_assignment_do_not_change_the_hash():
    want = sha(3, *LOCAL)
    assert sha(3, *LOCAL, workers=3, how="random") == want
    assert sha(3, *LOCAL, workers=2, how="capacity") == want
    assert sha(3, *LOCAL, workers=5, how="round-robin") == want  # more workers than replicas
    if LOCAL_SHA is not None:
        assert sha(4, *LOCAL) == LOCAL_SHA


def test_a_power_of_two_replica_count_also_holds():
    argv = [*TINY, "--replicas", "4", "--sync-every", "3", "--outer-lr", "1", "--outer-momentum", "0"]
    assert sha(2, *argv) == sha(2, *argv, workers=3, how="random")


def test_resume_mid_run_ends_on_the_uninterrupted_hash(tmp_path):
    ck = tmp_path / "local.pt"
    want = sha(4, *LOCAL)
    half = train(settings(2, *LOCAL), quiet=True, save=str(ck))
    assert half["steps"] == 2
    assert sha(4, *LOCAL, resume=str(ck)) == want
    assert sha(4, *LOCAL, workers=2, how="random", resume=str(ck)) == want


def test_a_round_is_the_documented_arithmetic():
    """Round 0 and 1 of R=3, H=2 recomputed from the synchronous Trainer's pieces."""
    rs = settings(2, *LOCAL)
    hp = rs.hp
    luts = load_luts()
    tr = LocalTrainer(rs.spec, hp, rs.ds, luts)
    base = Trainer(rs.spec, Hyper(**{**hp.to_json(), "replicas": 1, "sync_every": 1}), rs.ds, luts)
    r, h, p = 3, 2, tr.layout.size
    gscale, gdiv = base.grad_scaling()
    theta = base.state.theta.copy()
    buf, ms, vs, inner, b1t, b2t = np.zeros(p), np.zeros((r, p)), np.zeros((r, p)), 0, 1.0, 1.0
    for rnd in range(2):
        q = np.zeros(p, np.int64)
        new_m, new_v = [], []
        for j in range(r):
            th = theta.copy()
            st = AdamState(ms[j].copy(), vs[j].copy(), inner, b1t, b2t)
            for i in range(h):
                s = (rnd * h + i) * r + j
                g = base.contribute(range(hp.n_micro), s, th).grad
                adam_step(th, st, g, hp, gscale, gdiv)
            x = np.floor((theta - th) * pow2(DELTA_FRAC_BITS) + 0.5)
            q += np.clip(x, -(2**51 // r), 2**51 // r).astype(np.int64)
            new_m.append(st.m)
            new_v.append(st.v)
        d = q * pow2(-DELTA_FRAC_BITS) / r
        buf = hp.outer_momentum * buf + d
        theta = theta - hp.outer_lr * (d + hp.outer_momentum * buf)
        ms, vs, inner, b1t, b2t = np.stack(new_m), np.stack(new_v), st.step, st.b1t, st.b2t
        tr.apply(tr.contribute(range(r)).grad)
        assert tr.theta.tobytes() == theta.tobytes()
        own = [tr.own[j] for j in range(r)]  # this device computed every replica: its moments
        assert np.stack([o[2] for o in own]).tobytes() == ms.tobytes()
        assert np.stack([o[3] for o in own]).tobytes() == vs.tobytes()
        assert not tr.state.m.any() and not tr.state.v.any()  # round 2 < K: still the anchor's
        assert tr.state.outer.tobytes() == buf.tobytes()
        assert (tr.state.step, tr.state.inner, tr.state.b1t, tr.state.b2t) == (rnd + 1, inner, b1t, b2t)


def test_a_task_carries_only_its_replicas_moments():
    """In an anchor round (every round at K = 1); between anchors no moments at all."""
    rs = settings(1, *LOCAL)
    between = LocalTrainer(rs.spec, rs.hp, rs.ds, load_luts())  # K = 8: round 0 is not an anchor
    assert not between.contribute([1]).grad[between.layout.size:].any()
    rs = settings(1, *LOCAL, "--moments-every", "1")
    tr = LocalTrainer(rs.spec, rs.hp, rs.ds, load_luts())
    p = tr.layout.size
    assert tr.total_size == p * (1 + 4 * 3) and tr.n_tasks == 3
    one = tr.contribute([1]).grad
    blocks = one[p:].reshape(3, 4 * p)
    assert not blocks[0].any() and not blocks[2].any() and blocks[1].any()
    whole = tr.contribute([0, 1, 2]).grad
    parts = sum(tr.contribute([j]).grad for j in (2, 0, 1))
    assert np.array_equal(whole, parts)


def test_moments_pack_to_halves_and_back():
    m = np.array([0.0, -0.0, 5e-324, -1.5, 1e300, np.pi])
    v = np.array([0.0, 5e-324, 2.0, 1e-300, 1.0, 3.0])
    packed = pack_moments(m, v)
    assert packed.dtype == np.int64 and packed.min() >= 0 and packed.max() <= 0xFFFFFFFF
    m2, v2 = unpack_moments(packed, m.size)
    assert m2.tobytes() == m.tobytes() and v2.tobytes() == v.tobytes()
    with pytest.raises(ValueError):
        unpack_moments(np.full(4 * m.size, 2**32), m.size)  # not a 32-bit half
    with pytest.raises(ValueError):
        unpack_moments(pack_moments(m, -v - 1.0), m.size)  # a negative second moment


def test_a_checkpoint_carries_the_round_state_and_refuses_a_broken_one():
    rs = settings(2, *LOCAL)
    tr = LocalTrainer(rs.spec, rs.hp, rs.ds, load_luts())
    for _ in range(2):
        tr.apply(tr.contribute(range(3)).grad)
    data = save_checkpoint(tr.identity, tr.state.step, tr.theta, None, local=tr.state)
    ck = load_checkpoint(data, tr.identity)
    assert ck.step == 2 and ck.adam.step == 4
    for name in ("theta", "outer", "m", "v"):
        assert getattr(ck.local, name).tobytes() == getattr(tr.state, name).tobytes()
    import io

    import torch

    obj = torch.load(io.BytesIO(data), weights_only=True)
    obj["local"]["m"] = obj["local"]["m"][:1]
    buf = io.BytesIO()
    torch.save(obj, buf)
    with pytest.raises(CheckpointError, match="moments of replicas 1..2"):
        load_checkpoint(buf.getvalue(), tr.identity)
    obj = torch.load(io.BytesIO(data), weights_only=True)
    obj["adam"]["step"] = 2  # the inner steps must be rounds * H
    buf = io.BytesIO()
    torch.save(obj, buf)
    with pytest.raises(CheckpointError, match="step counters"):
        load_checkpoint(buf.getvalue(), tr.identity)


@pytest.mark.parametrize("hyper, words", [
    ({"replicas": 0}, "--replicas must lie in [1, 1024]"),
    ({"replicas": 1025}, "--replicas must lie in [1, 1024]"),
    ({"sync_every": 0}, "--sync-every must lie in [1, 100000]"),
    ({"outer_lr": 0.0}, "--outer-lr must be a finite number in (0, 4]"),
    ({"outer_lr": float("nan")}, "--outer-lr must be a finite number in (0, 4]"),
    ({"outer_momentum": 1.0}, "--outer-momentum must be a finite number in [0, 1)"),
])
def test_a_received_runs_local_settings_are_checked(hyper, words):
    with pytest.raises(SpecError) as e:
        Hyper(**hyper).validate()
    assert str(e.value) == words


@pytest.mark.parametrize("argv, words", [
    (("--replicas", "0"), "--replicas must be a whole number in [1, 1024], not '0'"),
    (("--sync-every", "1.5"), "--sync-every must be a whole number in [1, 100000], not '1.5'"),
    (("--outer-lr", "inf"), "--outer-lr must be a finite number in (0, 4], not 'inf'"),
    (("--outer-momentum", "1"), "--outer-momentum must be a finite number in [0, 0.999], not '1'"),
])
def test_a_bad_value_is_one_line(argv, words):
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", "train", "--quiet", *argv],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.stderr


def test_the_state_frame_carries_the_whole_round_state():
    """A late joiner's or a restore's STATE, through the real frame codec: the receiver
    (decoding with its trainer's state_sizes) ends on the sender's round state."""
    from daisychain.peer import frames as F
    from daisychain.peer.framing import Reassembler, encode_frames
    from daisychain.peer.run.state import checked_state, load_state, state_message

    rs = settings(2, *LOCAL)
    luts = load_luts()
    a, b = (LocalTrainer(rs.spec, rs.hp, rs.ds, luts) for _ in range(2))
    for _ in range(2):
        a.apply(a.contribute(range(a.n_tasks)).grad)
    msg = state_message(a)
    r = Reassembler()
    got = None
    for frame in encode_frames(F.to_message(msg, a.run_id), 1):
        got = r.feed(frame) or got
    dec = F.from_message(got, b.total_size, b.state_sizes)
    assert dec.params_sha256 == a.params_sha256()
    load_state(b, checked_state(b, dec.step, dec.theta, dec.m, dec.v, dec.b1t, dec.b2t, dec.params_sha256))
    for name in ("theta", "outer", "m", "v"):
        assert getattr(b.state, name).tobytes() == getattr(a.state, name).tobytes()
    assert (b.state.step, b.state.inner, b.state.b1t, b.state.b2t) == \
        (a.state.step, a.state.inner, a.state.b1t, a.state.b2t)
    with pytest.raises(F.FrameError):  # a synchronous run's sizes do not read it
        F.from_message(got, b.layout.size)


def test_the_rollback_window_goes_back_to_a_rounds_bits():
    from daisychain.peer.run.rollback import Window
    from daisychain.peer.run.state import tensor_bounds

    rs = settings(6, *LOCAL)
    tr = LocalTrainer(rs.spec, rs.hp, rs.ds, load_luts())
    bounds = tensor_bounds(tr)
    assert bounds[0] == 0 and bounds[-1] == tr.total_size and bounds == sorted(bounds)
    w = Window(3, bounds)
    w.reset(tr)
    seen = {}
    for step in range(6):
        seen[step] = tr.snapshot()
        total = tr.contribute(range(tr.n_tasks)).grad
        tr.apply(total)
        w.record(tr, step, total, {"p1"} if step >= 2 else set())
    assert w.first == 3 and w.nbytes() > 0
    w.go_back(tr, 4)
    for name in ("theta", "outer", "m", "v"):
        assert getattr(tr.state, name).tobytes() == getattr(seen[4], name).tobytes()
    assert tr.state.step == 4 and tr.state.inner == 8


def test_export_and_sample_read_a_local_steps_checkpoint(tmp_path):
    """`daisychain export` writes theta_g (the run's hash); `sample` runs on it."""
    ck, out = tmp_path / "local.pt", tmp_path / "local.safetensors"
    want = train(settings(2, *LOCAL), quiet=True, save=str(ck))["params_sha256"]
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", "export", str(ck), "--to", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and f"params-sha256 {want}" in r.stdout + r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", "sample", str(ck), "--length", "5"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr

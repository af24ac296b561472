"""Local steps' moments stay home between anchors (engine/local.py, issue 22 follow-up).

The rules under test: the parameters' bits do not depend on K (--moments-every); a replica
computed by a device that did not compute it last round (a moved replica, a late joiner, a
checker) is replayed from the anchor to the same bits; a device's private moments are used
only when they follow the held history; between anchors contributions and totals carry no
moments (a total that does is refused); checkpoints and STATE carry the history.
"""

from __future__ import annotations

import numpy as np
import pytest

from daisychain.engine.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from daisychain.engine.local import LocalTrainer
from daisychain.peer.intcodec import encode_ints
from daisychain.peer.run.state import checked_state, state_message, tensor_bounds
from daisychain.units import load_luts
from local_cases import JS_RUN_SETUP, LOCAL, TINY, settings, sha

def trainer(rs) -> LocalTrainer:
    return LocalTrainer(rs.spec, rs.hp, rs.ds, load_luts())


@pytest.mark.parametrize("k", [1, 2, 5])
def test_the_hash_does_not_depend_on_k(k):
    """--moments-every K changes the wire, not the bits; the default K keeps the run id it had
    before K existed, another K is in the identity JSON (every peer agrees on the totals)."""
    want = sha(7, *LOCAL)  # K = 8: no anchor in 7 rounds
    assert sha(7, *LOCAL, "--moments-every", str(k)) == want
    assert sha(7, *LOCAL, "--moments-every", str(k), workers=2, how="random") == want
    assert "moments_every" not in settings(7, *LOCAL).hp.to_json()
    assert settings(7, *LOCAL, "--moments-every", str(k)).hp.to_json()["moments_every"] == k
    assert "moments_every" not in settings(7, *TINY, "--moments-every", str(k)).hp.to_json()  # synchronous


def test_a_moved_replica_is_replayed_from_the_anchor_to_the_same_bits():
    rs = settings(6, *LOCAL)
    a, b = trainer(rs), trainer(rs)
    for _ in range(3):  # a computes every replica; b only applies the totals
        total = a.contribute(range(3)).grad
        assert not total[a.layout.size:].any()  # between anchors: q only
        b.apply(total)
        a.apply(total)
    assert a.state.hist.shape == (3, a.layout.size) and a.replayed == 0
    want = a.contribute([1]).grad
    assert b.contribute([1]).grad.tobytes() == want.tobytes()
    assert b.replayed == 3  # rounds 0..2 of replica 1, then round 3
    b.own.clear()  # another device took replica 1 this round: b replays again
    assert b.contribute([1]).grad.tobytes() == want.tobytes() and b.replayed == 6
    b.apply(a.contribute(range(3)).grad)  # b's own moments of replica 1 after round 3 follow the history
    a.apply(a.contribute(range(3)).grad)
    assert b.contribute([1]).grad.tobytes() == a.contribute([1]).grad.tobytes() and b.replayed == 6


def test_private_moments_of_another_history_are_not_used():
    rs = settings(4, *LOCAL)
    a, b = trainer(rs), trainer(rs)
    b.contribute([0], 0, a.theta + 1e-3)  # b's moments of replica 0 after a round 0 that never was
    total = a.contribute(range(3)).grad
    a.apply(total)
    b.apply(total)
    assert b.contribute([0]).grad.tobytes() == a.contribute([0]).grad.tobytes() and b.replayed == 1
    b.own[0] = (0, b.own[0][1], b.own[0][2] + 1.0, b.own[0][3])  # load drops them all
    b.load(a.snapshot())
    assert not b.own


def test_an_anchor_round_carries_and_installs_every_replicas_moments():
    rs = settings(4, *LOCAL, "--moments-every", "2")
    tr = trainer(rs)
    p = tr.layout.size
    tr.apply(tr.contribute(range(3)).grad)  # round 0: between anchors
    assert not tr.state.m.any() and tr.state.hist.shape == (1, p)
    one = tr.contribute([2]).grad  # round 1: an anchor
    assert one[p + 8 * p:].any() and not one[p:p + 8 * p].any()
    total = tr.contribute(range(3)).grad
    own = np.stack([tr.own[j][2] for j in range(3)])
    tr.apply(total)
    assert tr.state.m.tobytes() == own.tobytes() and tr.state.hist.shape == (0, p)


def test_moments_between_anchors_are_refused():
    rs = settings(4, *LOCAL)
    tr = trainer(rs)
    p = tr.layout.size
    total = tr.contribute(range(3)).grad
    bad = total.copy()
    bad[p + 5] = 7
    assert tr.contribution_error(bad, [0, 1, 2]) == "moments of replica 0 in a round between anchors"
    assert tr.contribution_error(bad, [0, 1, 2], 7) is None  # an anchor round: moments are due
    assert tr.contribution_error(bad, [1, 2], 7) == "moments of replica 0, which it was not given"
    before = tr.snapshot()
    with pytest.raises(ValueError, match="between anchors"):
        tr.apply(bad)
    assert tr.state.theta.tobytes() == before.theta.tobytes() and tr.state.step == 0


def test_the_wire_bytes_between_anchors_are_the_deltas():
    rs = settings(4, *LOCAL)
    tr = trainer(rs)
    bounds = tensor_bounds(tr)
    between = len(encode_ints(tr.contribute(range(3)).grad, bounds)[1])
    head = bounds[:bounds.index(tr.layout.size) + 1]
    deltas = len(encode_ints(tr.contribute(range(3)).grad[:tr.layout.size], head)[1])
    assert between == deltas + 6 * 4 * 3  # a zero block costs its 6-byte segment head


def test_state_and_checkpoint_carry_the_history():
    rs = settings(4, *LOCAL)
    tr = trainer(rs)
    for _ in range(3):
        tr.apply(tr.contribute(range(3)).grad)
    msg = state_message(tr)
    other = trainer(rs)
    other.load(checked_state(other, msg.step, msg.theta, msg.m, msg.v, msg.b1t, msg.b2t, msg.params_sha256))
    assert other.state.hist.tobytes() == tr.state.hist.tobytes()
    assert other.contribute([2]).grad.tobytes() == tr.contribute([2]).grad.tobytes()
    data = save_checkpoint(tr.identity, tr.state.step, tr.theta, None, local=tr.state)
    ck = load_checkpoint(data, tr.identity)
    assert ck.local.hist.tobytes() == tr.state.hist.tobytes()
    import io

    import torch

    obj = torch.load(io.BytesIO(data), weights_only=True)
    obj["local"]["hist"] = obj["local"]["hist"][:2]
    buf = io.BytesIO()
    torch.save(obj, buf)
    with pytest.raises(CheckpointError, match="the 3 round\\(s\\) since its anchor"):
        load_checkpoint(buf.getvalue(), tr.identity)


def test_capacity_is_measured_on_a_state_past_its_anchor():
    """measure_capacity ran round 0, which a state at round 3 of K = 2 no longer holds: a
    host resuming a local-steps checkpoint stopped with a ValueError (mesh test)."""
    from daisychain.engine.capacity import measure_capacity

    rs = settings(4, *LOCAL, "--moments-every", "2")
    tr = trainer(rs)
    for _ in range(3):
        tr.apply(tr.contribute(range(3)).grad)
    assert measure_capacity(tr, 0.01) > 0 and tr.replayed == 0


JS_DRIVER = JS_RUN_SETUP + r"""
const spec = S.ModelSpec.fromJson(job.model);
const hyper = S.makeHyper(job.hyper);
const make = async (k) => { const t = await L.makeTrainer({ spec, hyper, dataset: ds, luts, units: new P.CpuUnits(luts) }); t.momentsEvery = k; return t; };
const same = (x, y) => x.length === y.length && x.every((e, i) => e === y[i]);
const out = {};
for (const k of job.ks) {
  const a = await make(k);
  const b = await make(k);
  let moved = true;
  let state = true;
  for (let r = 0; r < job.rounds; r++) {
    const parts = [];
    for (let j = 0; j < hyper.replicas; j++) parts.push((await a.contribute([j])).grad);
    const mine = (await b.contribute([r % hyper.replicas])).grad;  // b computes another replica each round
    moved = moved && same(mine, parts[r % hyper.replicas]);
    if (r === job.rounds - 1) {
      const c = await make(k);
      c.load(c.stateOf(a.wireState()));
      state = same((await c.contribute([1])).grad, parts[1]);
    }
    const total = new Float64Array(a.totalSize);
    for (const g of parts) for (let i = 0; i < total.length; i++) total[i] += g[i];
    a.apply(total);
    b.apply(total);
  }
  const stale = await a.contribute([0], 0, a.theta.slice()).then(() => "computed", (e) => e.name);
  out[k] = { sha: await a.paramsSha256(), bsha: await b.paramsSha256(), moved, state, replayed: b.replayed, hist: a.hist.length, stale };
}
console.log(JSON.stringify(out));
"""


def python_moved(rs, k: int, rounds: int) -> dict:
    a, b = trainer(rs), trainer(rs)
    a.moments_every = b.moments_every = k
    for r in range(rounds):
        parts = [a.contribute([j]).grad for j in range(a.n_tasks)]
        assert b.contribute([r % a.n_tasks]).grad.tobytes() == parts[r % a.n_tasks].tobytes()
        total = sum(parts)
        a.apply(total)
        b.apply(total)
    return {"sha": a.params_sha256(), "replayed": b.replayed, "hist": len(a.state.hist)}


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_js_anchors_replay_a_moved_replica_to_pythons_bits(tmp_path):
    from daisychain import package_path
    from jsrun import run_js

    rounds, ks = 7, [1, 2, 5, 8]
    rs = settings(rounds, *LOCAL)
    want = {k: python_moved(rs, k, rounds) for k in ks}
    assert len({w["sha"] for w in want.values()}) == 1 and want[8]["sha"] == sha(rounds, *LOCAL)
    data = tmp_path / "text.dcds"
    data.write_bytes(rs.ds.to_bytes())
    job = {"model": rs.spec.to_json(), "hyper": rs.hp.to_json(), "rounds": rounds,
           "fingerprint": rs.ds.fingerprint, "ks": ks}
    got = run_js(JS_DRIVER, imports={"D": "engine/data.js", "S": "engine/spec.js", "P": "engine/cpu_units.js",
                                     "L": "engine/local.js"},
                 data=job, args=[str(package_path("luts")), str(data)], timeout=300)
    for k in ks:
        g = got[str(k)]
        assert g["moved"] and g["state"], (k, g)
        assert g["stale"] == ("computed" if k > rounds else "StaleRound")  # round 0: before the anchor?
        assert (g["sha"], g["bsha"], g["replayed"], g["hist"]) == (want[k]["sha"], want[k]["sha"],
                                                                   want[k]["replayed"], want[k]["hist"]), (k, g, want[k])


def test_a_steady_room_keeps_each_replica_on_its_device_and_never_replays():
    """Three peers, R = 4, no spot-checks: the coordinator gives each replica to the device
    that computed it last round (run/split.py split_tasks), so every device has its own
    moments and none replays; a peer that drops mid-round gives its replica to one that
    replays it, the others keep theirs; the room ends on train's hash."""
    from daisychain.peer import run as R
    from run_net import Net

    rs = settings(9, *TINY, "--replicas", "4", "--sync-every", "2")
    want = sha(9, *TINY, "--replicas", "4", "--sync-every", "2")
    net = Net(rs, 3)
    host = net.peers["p0"]
    host.verify_rate = 0.0
    owners, state = [], {"killed": False}
    begin = host.coordinator.aggregation.begin  # the step's split (run/aggregator.py)

    def spy(live):
        out = begin(live)
        owners.append(dict(host.coordinator.owner))
        return out
    host.coordinator.aggregation.begin = spy

    def hook(net):
        if not state["killed"] and host.step == 5 and any(pid == "p2" for pid, _ in net.computes):
            state["before"] = sum(net.peers[p].member.trainer.replayed for p in ("p0", "p1", "p2"))
            net.kill("p2")
            state["killed"] = True
            return True
        return False
    net.run(hook=hook)
    for pid in net.room():
        end = net.of(R.Ended, pid)[0]
        assert end.params_sha256 == want and end.agreed
    assert owners[0] == owners[4] and sorted(set(owners[0].values())) == ["p0", "p1", "p2"]
    gone = [j for j, p in owners[0].items() if p == "p2"]
    assert all(owners[-1][j] == p for j, p in owners[0].items() if p != "p2")  # kept
    assert state["killed"] and state["before"] == 0 and all(owners[-1][j] != "p2" for j in gone)
    replays = {pid: net.peers[pid].member.trainer.replayed for pid in ("p0", "p1")}
    # the taker of p2's replica in round 5 replays rounds 0..4 of it from the anchor; in
    # round 6 it goes to the first peer with room (which may replay rounds 0..5); round 8 is
    # after the anchor of round 7
    assert len(gone) == 1 and 5 <= sum(replays.values()) <= 5 + 6, replays


def test_a_compute_the_room_moved_past_is_dropped_not_fatal():
    """A compute of round 1 that waited while the total of anchor round 1 (K = 2) was applied
    cannot be replayed (the history before the anchor is gone): StaleRound, which the shell's
    compute seam turns into None (daisy-peer drops it instead of stopping on an internal
    error); a round ahead of the trainer is refused the same way."""
    from daisychain.engine.local import StaleRound
    from daisychain.peer.run.split import contribute_at

    rs = settings(4, *LOCAL, "--moments-every", "2")
    tr = trainer(rs)
    for _ in range(2):
        tr.apply(tr.contribute(range(3)).grad)
    with pytest.raises(StaleRound):
        tr.contribute([0], 1)
    assert contribute_at(tr, tr.theta.copy(), 1, [0]) is None
    assert contribute_at(tr, tr.theta.copy(), 3, [0]) is None
    assert contribute_at(tr, tr.theta.copy(), 2, [0]) is not None


K_CASES = [{"moments_every": 0}, {"moments_every": 1025}, {"moments_every": 2.5}, {"replicas": 2, "moments_every": 4},
           {"replicas": 2, "moments_every": 8}, {"moments_every": 3}, {"sync_every": 4, "moments_every": 1}]


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_k_gets_the_same_words_and_json_in_both_languages():
    """A received run's K is checked with the same words, and is in the identity JSON only
    for a local-steps run with another K than the default (spec.py / spec.js)."""
    from daisychain.engine.spec import Hyper, SpecError
    from jsrun import run_js
    from test_local_steps_js import HYPER_DRIVER

    def py(c):
        try:
            hp = Hyper(**c)
            hp.validate()
            return {"json": hp.to_json()}
        except SpecError as exc:
            return {"error": str(exc)}

    want = [py(c) for c in K_CASES]
    assert [("error" in w) for w in want] == [True, True, True, False, False, False, False]
    assert want[3]["json"]["moments_every"] == 4 and "moments_every" not in want[4]["json"]
    assert "moments_every" not in want[5]["json"] and want[6]["json"]["moments_every"] == 1
    assert run_js(HYPER_DRIVER, imports={"{ makeHyper, hyperJson }": "engine/spec.js"}, data=K_CASES) == want

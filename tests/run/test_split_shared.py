"""The link-aware split (peer/run/split.py finish_shares / webui/run/split.js finishShares): held to each other
by shared cases (tests/scenarios/split.json: the same floats and counts in both languages),
checked for what it promises (everyone finishes together, everyone keeps a micro-batch), and
driven through a coordinator whose member's link costs time."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from daisychain.engine.cli import train
from daisychain.engine.trainer import capacity_split
from daisychain.peer import frames as F
from daisychain.peer import run as R

from jsrun import run_js
from run_net import Net, settings

CASES = json.loads((Path(__file__).parents[1] / "scenarios" / "split.json").read_text())["cases"]

DRIVER = r"""
const out = [];
for (const c of DATA) {
  const shares = finishShares(c.spm, c.fixed, c.n);
  const ids = Array.from({ length: c.n }, (_, j) => j);
  out.push({ shares, counts: capacitySplit(ids, shares).map((p) => p.length) });
}
console.log(JSON.stringify(out));
"""


@pytest.mark.parametrize("case", CASES, ids=[c["about"][:40] for c in CASES])
def test_python_gives_the_shared_shares_and_counts(case):
    shares = R.finish_shares(case["spm"], case["fixed"], case["n"])
    assert shares == case["shares"]  # the exact floats
    assert [len(p) for p in capacity_split(list(range(case["n"])), shares)] == case["counts"]


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_js_gives_the_same_floats_and_counts():
    got_all = run_js(DRIVER, imports={"{ finishShares, capacitySplit }": "run/index.js"}, data=CASES)
    for case, got in zip(CASES, got_all, strict=True):
        assert got["shares"] == case["shares"], case["about"]
        assert got["counts"] == case["counts"], case["about"]


def test_everyone_finishes_together_and_keeps_a_micro_batch():
    rng = random.Random(5)
    for _ in range(300):
        k = rng.randint(2, 8)
        spm = [rng.uniform(1e-5, 1e-2) for _ in range(k)]
        fixed = [0.0] + [rng.uniform(0, 0.2) * rng.randint(0, 1) for _ in range(k - 1)]
        n = rng.randint(k, 1024)
        counts = [len(p) for p in capacity_split(list(range(n)), R.finish_shares(spm, fixed, n))]
        assert sum(counts) == n and min(counts) >= 1
        shares = R.finish_shares(spm, fixed, n)
        finish = [x + c * s for c, s, x in zip(counts, spm, fixed)]
        # the continuous optimum T: every peer above its one micro-batch ends exactly at T;
        # rounding to whole micro-batches adds at most one micro-batch to anyone's time
        t = [x + w * s for w, s, x in zip(shares, spm, fixed) if w > 1]
        assert max(t) - min(t) < 1e-9
        for c, s, x, w in zip(counts, spm, fixed, shares):
            assert x + c * s <= (max(t) + s if w > 1 else x + s) + 1e-12
        assert max(finish) <= max(max(t) + max(spm), max(x + s for s, x in zip(spm, fixed))) + 1e-12


def test_a_coordinator_computes_more_while_its_member_s_link_costs_time():
    """p0 and p1 have the same capacity; p1's contributions come back 6 ms after a compute
    of 1 ms per micro-batch (the clock of p0 is set as a shell would: node.py brings it up
    to now before every input). The first steps split evenly; once p0 has timed itself and
    p1, it takes 11 of the 16 micro-batches and p1 5, which makes both finish at 11 ms. The
    hash is the single-process one: the split never changes the bits."""
    rs = settings("--steps", "12", "--batch", "256", "--micro-batch", "16")
    net = Net(rs, 2)
    host = net.peers["p0"]
    host.verify_rate = 0.0  # one task per peer and step: the timings below are then exact
    receive, computed = host.receive, host.computed

    def arrive(task: int, n: int, link: float) -> None:
        t = host.coordinator.tasks.get(task)
        if t is not None:
            host.now = max(host.now, t.sent_at + 0.001 * n + link)

    def timed_receive(sender, msg, run_id):
        if isinstance(msg, F.Contrib):
            arrive(msg.task, len(msg.micro), 0.006)
        return receive(sender, msg, run_id)

    def timed_computed(step, task, result):
        arrive(task, len(host.coordinator.pending.get((step, task), ())), 0.0)
        return computed(step, task, result)

    def host_first(net) -> bool:  # events in time order: p0's compute ends before p1's answer
        for i, (pid, c) in enumerate(net.computes):
            if pid == "p0":
                del net.computes[i]
                net.do_compute(pid, c)
                return True
        return False

    host.receive, host.computed = timed_receive, timed_computed
    net.run(hook=host_first)
    shares = [dict(c.contributors) for c in net.of(R.Committed, "p0")]
    assert shares[0] == {"p0": 8, "p1": 8}
    assert shares[-1] == {"p0": 11, "p1": 5}
    assert abs(host.coordinator.members["p1"].link_s - 0.006) < 1e-4 and abs(host.coordinator.self_spm - 0.001) < 1e-12
    want = train(rs, quiet=True)["params_sha256"]
    for pid in net.room():
        end = net.of(R.Ended, pid)[0]
        assert end.params_sha256 == want and end.agreed


# -- the timing that feeds the split, the same in both languages ---------------------------

TIMING_DRIVER = r"""
const out = [];
for (const c of DATA) {
  const peer = new RunPeer("p0", { capacity: c.caps.p0, window: 0 });
  peer.member.trainer = { step: 0 };
  peer.member.run = { run_id: "" };
  const rp = new Coordinator(peer, peer.member); // the coordinator alone, on a replica of a step only
  rp.timingFrom = c.timing_from;
  for (const [id, cap] of Object.entries(c.caps)) {
    if (id !== "p0") rp.crew.set(id, { id, capacity: cap, linkS: 0.0, timed: 0 });
  }
  for (const s of c.steps) {
    peer.member.trainer = { step: s.step }; // the step a replica is at comes from its trainer
    rp.tasks = new Map(s.tasks.map(([peer, n], i) => [i, { task: i, assignees: [peer], sentAt: s.t0,
      micro: Array.from({ length: n }, (_, j) => j), result: null, kind: "main" }]));
    for (const [i, secs] of s.busy ?? []) rp.computeTook(s.step, i, secs);
    for (const [i, now] of s.done) {
      const t = rp.tasks.get(i);
      peer.now = now;
      t.result = { peer: t.assignees[0] };
      rp._timeTask(t.assignees[0], t);
    }
  }
  for (const [step, task, n, secs] of c.own ?? []) { // our own computes, timed by the shell
    rp.ownMicro.set(`${step}:${task}`, n);
    rp.computeTook(step, task, secs);
  }
  const links = {};
  for (const [id, m] of rp.crew) links[id] = m.linkS;
  out.push({ self_spm: rp.selfSpm, self_fixed: rp.selfFixed, links, weights: rp._splitWeights(c.live, c.n),
    own_spm: rp.ownSpm, deadline: rp._deadline("p0", 2) });
}
console.log(JSON.stringify(out));
"""

# each step: tasks as (first assignee, micro-batches), dispatched at t0; done: (task, when)
TIMING_CASES = [
    {"about": "one member 6 ms away, timed over three steps", "caps": {"p0": 1.0, "p1": 1.0},
     "timing_from": 0, "live": ["p0", "p1"], "n": 16,
     "steps": [{"step": s, "t0": 0.1 * s, "tasks": [["p0", 8], ["p1", 8]],
                "done": [[0, 0.1 * s + 0.008], [1, 0.1 * s + 0.014]]} for s in range(4)]},
    {"about": "the term's first step is left out", "caps": {"p0": 2.0, "p1": 1.0},
     "timing_from": 3, "live": ["p0", "p1"], "n": 12,
     "steps": [{"step": s, "t0": s, "tasks": [["p0", 8], ["p1", 4]],
                "done": [[0, s + 0.004], [1, s + 0.02]]} for s in (2, 3, 4, 5)]},
    {"about": "a share of two tasks (its own and a check) is timed once both are in",
     "caps": {"p0": 1.0, "p1": 3.0, "p2": 1.0}, "timing_from": 0, "live": ["p0", "p1", "p2"], "n": 40,
     "steps": [{"step": s, "t0": 1.0 * s, "tasks": [["p0", 7], ["p0", 1], ["p1", 24], ["p2", 8]],
                "done": [[0, s + 0.007], [1, s + 0.008], [3, s + 0.011], [2, s + 0.030]]}
               for s in range(5)]},
    {"about": "the coordinator's own compute timed by its shell: the rest of its wait is the step's handling",
     "caps": {"p0": 1.0, "p1": 1.0}, "timing_from": 0, "live": ["p0", "p1"], "n": 8,
     "steps": [{"step": s, "t0": s, "tasks": [["p0", 2], ["p1", 6]], "busy": [[0, 0.002]],
                "done": [[0, s + 0.012], [1, s + 0.030]]} for s in range(4)]},
    {"about": "our own computes timed by the shell: our deadlines follow them, from timing_from on",
     "caps": {"p0": 100.0, "p1": 1.0}, "timing_from": 2, "live": ["p0", "p1"], "n": 4, "steps": [],
     "own": [[1, 0, 2, 9.0], [2, 3, 2, 3.0], [3, 5, 1, 2.0], [4, 7, 2, -1.0]]},
    {"about": "a member back sooner than its capacity says: no link cost, the capacities",
     "caps": {"p0": 1.0, "p1": 2.0}, "timing_from": 0, "live": ["p0", "p1"], "n": 9,
     "steps": [{"step": s, "t0": s, "tasks": [["p0", 3], ["p1", 6]],
                "done": [[1, s + 0.002], [0, s + 0.003]]} for s in range(3)]},
]


def _python_timing(c: dict) -> dict:
    peer = R.RunPeer("p0", capacity=c["caps"]["p0"], window=0)
    peer.member.trainer = SimpleNamespace(state=SimpleNamespace(step=0))
    rp = R.Coordinator(peer, peer.member)  # the coordinator alone, on a replica of a step only
    rp.timing_from = c["timing_from"]
    for pid, cap in c["caps"].items():
        if pid != "p0":
            rp.members[pid] = R._Member(pid, capacity=cap)
    for s in c["steps"]:
        peer.member.trainer = SimpleNamespace(state=SimpleNamespace(step=s["step"]))  # its step
        rp.tasks = {i: R._Task(i, tuple(range(n)), [peer], s["t0"], 1e9)
                    for i, (peer, n) in enumerate(s["tasks"])}
        for i, secs in s.get("busy", []):
            rp.compute_took(s["step"], i, secs)
        for i, now in s["done"]:
            t = rp.tasks[i]
            peer.now = now
            t.result = (t.assignees[0], None, 0.0, 0)
            rp._time_task(t.assignees[0], t)
    for step, task, n, secs in c.get("own", []):  # our own computes, timed by the shell
        rp.own_micro[(step, task)] = n
        rp.compute_took(step, task, secs)
    return {"self_spm": rp.self_spm, "self_fixed": rp.self_fixed,
            "links": {p: m.link_s for p, m in rp.members.items()},
            "weights": rp._split_weights(c["live"], c["n"]), "own_spm": rp.own_spm, "deadline": rp._deadline("p0", 2)}


def test_the_timing_that_feeds_the_split():
    """What the Python coordinator learns from these timings (the JS twin must match)."""
    one, skipped, checks, busy, own, flat = (_python_timing(c) for c in TIMING_CASES)
    # 8 micro-batches in 8 ms; p1's first share is warm-up, then three samples of 6 ms:
    # a running mean of weight 1/2 from 0 gives 6 ms * (1 - 1/8)
    assert one["self_spm"] == pytest.approx(0.001) and one["links"]["p1"] == pytest.approx(0.00525)
    assert one["weights"][0] > one["weights"][1] and sum(one["weights"]) == pytest.approx(16)
    # step 2 (before timing_from) and p1's first timed share (step 3) are left out: two
    # samples of 20 ms less its 4 micro-batches at half p0's speed (4 ms) = 16 ms
    assert skipped["self_spm"] == pytest.approx(0.0005) and skipped["links"]["p1"] == pytest.approx(0.012)
    # p0's share is 8 micro-batches in 8 ms (its two tasks together); after the first share
    # of each, four samples: p1 30 ms less 24 micro-batches at 3x p0's speed (8 ms), p2 11 ms
    # less 8 ms
    assert checks["self_spm"] == pytest.approx(0.001)
    assert checks["links"]["p1"] == pytest.approx(0.022 * 15 / 16)
    assert checks["links"]["p2"] == pytest.approx(0.003 * 15 / 16)
    assert flat["links"]["p1"] == 0.0 and flat["weights"] == [1.0, 2.0]  # the capacities
    # p0's 2 micro-batches computed in 2 ms (the shell's clock) but handed in 12 ms after the
    # dispatch: 1 ms per micro-batch and 10 ms of the step's handling (four samples: 10 ms *
    # 15 / 16), not 6 ms per micro-batch (before: at small shares the handling, spread over a
    # few micro-batches, made p0 look slow and gave its members more); p1: 30 ms less its 6
    # micro-batches (6 ms) = 24 ms (three samples); the split gives p0 the handling as its
    # fixed cost, like a member's link
    assert busy["self_spm"] == pytest.approx(0.001) and busy["self_fixed"] == pytest.approx(0.010 * 15 / 16)
    assert busy["links"]["p1"] == pytest.approx(0.024 * 7 / 8)
    assert busy["weights"] == R.finish_shares([busy["self_spm"]] * 2, [busy["self_fixed"], busy["links"]["p1"]], 8)
    assert one["self_fixed"] == 0.0  # untimed by its shell: as before
    # step 1 is before timing_from (warm-up), a negative time is no timing: 1.5 s then 2 s a
    # micro-batch, a running mean of weight 1/2: 1.75 s, so 2 micro-batches are late after
    # 4 * 1.75 * 2 + 0.5 s; untimed, after the floor (1/capacity: 2 s)
    assert own["own_spm"] == pytest.approx(1.75) and own["deadline"] == pytest.approx(14.5)
    assert one["own_spm"] is None and one["deadline"] == pytest.approx(max(2.0, 4 * one["self_spm"] * 2 + 0.5))


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_js_learns_the_same_from_the_same_timings():
    got_all = run_js(TIMING_DRIVER, imports={"{ Coordinator, RunPeer }": "run/index.js"}, data=TIMING_CASES)
    for case, got in zip(TIMING_CASES, got_all, strict=True):
        assert got == _python_timing(case), case["about"]  # the same floats


STICKY = json.loads((Path(__file__).parents[1] / "scenarios" / "split.json").read_text())["sticky"]
STICKY_DRIVER = r"""
console.log(JSON.stringify(DATA.map((c) => splitTasks(Array.from({ length: c.n }, (_, j) => j), c.weights, c.live,
  new Map(c.last)).parts)));
"""


@pytest.mark.parametrize("case", STICKY, ids=[c["about"][:40] for c in STICKY])
def test_python_keeps_the_shared_sticky_parts(case):
    parts, owner = R.split_tasks(list(range(case["n"])), case["weights"], case["live"],
                                 {j: p for j, p in case["last"]})
    assert parts == case["parts"]
    assert owner == {j: p for p, part in zip(case["live"], parts) for j in part}


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_js_keeps_the_same_sticky_parts():
    got = run_js(STICKY_DRIVER, imports={"{ splitTasks }": "run/split.js"}, data=STICKY)
    assert got == [c["parts"] for c in STICKY]


def test_sticky_parts_keep_the_counts_and_move_no_more_than_the_capacity_split():
    """Each peer gets the capacity split's count; no more replicas change hands than with the
    plain split; a synchronous run's split (no ``last``) is the capacity split itself."""
    rng = random.Random(11)
    for _ in range(300):
        live = [f"p{k}" for k in range(rng.randint(1, 5))]
        n = rng.randint(1, 12)
        w = [rng.uniform(0.2, 4) for _ in live]
        last = {j: rng.choice(live + ["gone"]) for j in range(n)}
        plain = capacity_split(list(range(n)), w)
        parts, owner = R.split_tasks(list(range(n)), w, live, last)
        assert [len(p) for p in parts] == [len(p) for p in plain]
        assert sorted(j for p in parts for j in p) == list(range(n))
        moved = sum(owner[j] != last[j] for j in range(n))
        assert moved <= sum(p != last[j] for p, part in zip(live, plain) for j in part)
        assert R.split_tasks(list(range(n)), w, live)[0] == plain


def test_the_coordinators_own_long_task_is_not_given_to_a_backup_once_it_timed_itself():
    """The coordinator's own tasks were late by its capacity alone (1/capacity a micro-batch,
    the 2 s floor): a task longer than that (a local-steps round of seconds, a slow device)
    missed its deadline every step, and a member computed it again as its backup. Here p1
    computes at once and p0 takes 3 s a task (its shell's clock; the deadlines are checked
    meanwhile). The term's first steps give p0's task to a backup; once its shell timed a
    compute, its deadlines follow that timing and no later step does. The hash is the
    single-process one either way."""
    rs = settings("--steps", "8", "--batch", "64", "--micro-batch", "16")
    net = Net(rs, 2, caps={"p0": 100.0, "p1": 100.0})
    host = net.peers["p0"]
    host.verify_rate = 0.0

    def slow_host(net) -> bool:
        if net.wire:
            return False  # every message first: p1 answers at once
        for i, (pid, c) in enumerate(net.computes):
            if pid != "p0":
                del net.computes[i]
                net.do_compute(pid, c)
                return True
        for i, (pid, c) in enumerate(net.computes):
            del net.computes[i]
            net.now = max(net.now, host.now) + 3.0  # p0's compute takes 3 s
            net.feed("p0", host.tick(net.now))
            result = R.contribute_at(host.trainer, c.theta, c.step, c.micro)
            net.feed("p0", host.computed(c.step, c.task, result, seconds=3.0))
            return True
        return False

    net.run(hook=slow_host)
    backups = [e.text for e in net.of(R.Log, "p0") if "backup" in e.text]
    late_steps = sorted({int(t.split(" of step ")[1].split()[0]) for t in backups})
    assert late_steps and max(late_steps) <= 1, backups  # only while its own timing was unknown
    assert host.coordinator.own_spm == pytest.approx(1.5)
    want = train(rs, quiet=True)["params_sha256"]
    for pid in net.room():
        assert net.of(R.Ended, pid)[0].params_sha256 == want


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_a_tabs_capacity_is_in_the_runs_tasks_as_a_daisy_peers_is():
    """engine/capacity.py measure_capacity times a local-steps trainer's tasks, one replica's
    round of H inner steps of batch / micro-batch micro-batches each; the page measured
    micro-batches per second and sent that. In a local-steps room a tab then looked ~H x
    n_micro times faster than a daisy-peer to the split, and a tab host's own rounds (seconds)
    were late after 1/capacity, so a member computed them again as backups every round.
    ``taskRate`` (shell/run_speed.js) is what the tab's ready carries."""
    import dataclasses

    from daisychain.engine.local import make_trainer
    from daisychain.units import load_luts

    rs = settings("--steps", "2", "--batch", "32", "--micro-batch", "8")
    local = dataclasses.replace(rs.hp, replicas=2, sync_every=4)
    tr = make_trainer(rs.spec, local, rs.ds, load_luts())
    assert tr.n_tasks == 2  # a task is a replica's round: 4 inner steps of 4 micro-batches
    hypers = [{"batch": 32, "micro_batch": 8, "replicas": 1, "sync_every": 1},
              {"batch": 32, "micro_batch": 8, "replicas": 2, "sync_every": 4},
              {"batch": 64, "micro_batch": 16, "replicas": 4, "sync_every": 32}]
    got = run_js("console.log(JSON.stringify(DATA.map((h) => taskRate(320, h))));",
                 imports={"{ taskRate }": "shell/run_speed.js"}, data=hypers)
    assert got == [320, 320 / (4 * 4), 320 / (32 * 4)]

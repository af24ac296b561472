"""The link-aware split (run.py finish_shares / runpeer.js finishShares): held to each other
by shared cases (tests/scenarios/split.json: the same floats and counts in both languages),
checked for what it promises (everyone finishes together, everyone keeps a micro-batch), and
driven through a coordinator whose member's link costs time."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from daisychain import package_path
from daisychain.engine.cli import train
from daisychain.engine.trainer import capacity_split
from daisychain.peer import frames as F
from daisychain.peer import run as R

from test_peer_run import Net, settings

CASES = json.loads((Path(__file__).parent / "scenarios" / "split.json").read_text())["cases"]
NODE = shutil.which("node")

DRIVER = r"""
import { readFileSync } from "node:fs";
const { finishShares, capacitySplit } = await import(process.argv[2]);
const out = [];
for (const c of JSON.parse(readFileSync(0, "utf8"))) {
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


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_js_gives_the_same_floats_and_counts(tmp_path):
    driver = tmp_path / "driver.mjs"
    driver.write_text(DRIVER)
    r = subprocess.run([NODE, str(driver), package_path("webui", "runpeer.js").as_uri()],
                       input=json.dumps(CASES), capture_output=True, text=True, check=True)
    for case, got in zip(CASES, json.loads(r.stdout), strict=True):
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
        t = host.tasks.get(task)
        if t is not None:
            host.now = max(host.now, t.sent_at + 0.001 * n + link)

    def timed_receive(sender, msg, run_id):
        if isinstance(msg, F.Contrib):
            arrive(msg.task, len(msg.micro), 0.006)
        return receive(sender, msg, run_id)

    def timed_computed(step, task, result):
        arrive(task, len(host.pending.get((step, task), ())), 0.0)
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
    assert abs(host.members["p1"].link_s - 0.006) < 1e-4 and abs(host.self_spm - 0.001) < 1e-12
    want = train(rs, quiet=True)["params_sha256"]
    for pid in net.room():
        end = net.of(R.Ended, pid)[0]
        assert end.params_sha256 == want and end.agreed

"""A ring room with a tab in it: a daisy-peer hosts with ``--verify-rate 0 --aggregate ring``,
a CPU tab (the page's webui/run/ring.js) and a daisy-peer join; every step is summed by the
ring over their data channels, and every replica ends on ``daisychain train``'s hash.

    scripts/in-netns.sh .venv/bin/python -m pytest tests/browser_mesh/test_ring_tab.py -q
"""

from __future__ import annotations

import pytest
from mesh_helpers import needs_netns
from test_robustness import DIGITS, flags, peers, reference, tab_done  # noqa: F401  (fixture)

pytestmark = [pytest.mark.browser, pytest.mark.mesh, needs_netns]


def test_a_tab_takes_part_in_a_ring(browser_cpu, tabs, peers, server_url):  # noqa: F811
    s = dict(DIGITS, seed=8)
    ref = reference(s)
    host = peers(server_url, "py-host", "--create-room", "--approve", "all", "--wait-peers", "2",
                 "--verify-rate", "0", "--aggregate", "ring", *flags(s), progress=True)
    code = host.wait_for(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})").group(1)
    cpu = tabs(browser_cpu, "cpu-tab").open(f"room={code}")
    member = peers(server_url, "py-member", "--room", code)
    tab_done(cpu, ref["params_sha256"], s["steps"])
    r = member.result()
    assert r["params_sha256"] == ref["params_sha256"]
    kinds = {p["kind"]: p["micro_batches"] for p in r["peers"]}
    assert {"cpu", "python"} <= set(kinds) and all(kinds.values()), kinds
    assert host.result()["params_sha256"] == ref["params_sha256"]
    err = host.stderr()
    assert "aggregating by ring: 3 devices, no spot-checks (--aggregate ring)" in err
    print("ring steps redone by the star (missed deadline):", err.count("missed its deadline"))

"""Hand-over by composition (daisychain/peer/run/driver.py, webui/run/driver.js): the driver
holds a member (the replica) and, while it hosts, a coordinator built from that member; each
role's attributes live in its own object, stepping down drops the coordinator and the member
goes on from its term. The same facts in both languages. (Before, one RunPeer object of
mixins held every role's attributes and switched them with a ``coordinating`` flag.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from daisychain.peer.run import Coordinator, RunPeer
from jsrun import run_js

#: attributes of the coordinating that must live only in the coordinator (the rollback
#: window is not one: every member keeps it, and a new coordinator takes its member's, so it
#: goes on across terms: issue 34)
COORDINATOR_ONLY = ("members", "crew", "tasks", "checks", "banned", "strike_count",
                    "strikeCount", "next_task", "nextTask", "step_started", "stepStarted",
                    "unchecked_since", "uncheckedSince", "wait_for", "waitFor")
#: what the coordinator's Trust object owns (issue 39: before, a mixin's fields on the
#: coordinator itself)
TRUST_OWNS = ("strike_count", "strikeCount", "removed", "window", "unchecked_since", "uncheckedSince")


def _fake_trainer(step: int) -> SimpleNamespace:
    return SimpleNamespace(state=SimpleNamespace(step=step), identity={}, run_id="r" * 16,
                           params_sha256=lambda: "ab" * 32)


def python_facts() -> dict:
    p = RunPeer("p1", window=0)
    p.member.trainer, p.member.term = _fake_trainer(5), 3
    p.member.run = SimpleNamespace(run_id="r" * 16)
    p.channel_open("p2")
    lead = p.room_changed(["p1", "p2"], "p1")
    c = p.coordinator
    facts = {
        "coordinating": p.coordinating, "is_coordinator": isinstance(c, Coordinator),
        "shares_member": c.member is p.member, "same_trainer": c.trainer is p.member.trainer,
        "term": p.term, "announced": [o.to for o in lead if hasattr(o, "to")],
        "on_member": sorted(k for k in COORDINATOR_ONLY if k in vars(p.member)),
        "on_driver": sorted(k for k in COORDINATOR_ONLY if k in vars(p)),
        "on_coordinator": sorted(k for k in COORDINATOR_ONLY if k in vars(c)),
        # each role sums through its aggregation (the ring, with a star for the steps it
        # does not sum): a fresh coordinator's ring holds nothing
        "ring_sides": [type(p.member.aggregation).__name__, type(c.aggregation).__name__,
                       type(p.member.aggregation.star).__name__, type(c.aggregation.star).__name__],
        "new_ring_empty": c.aggregation.ring is None and c.aggregation.plan is None
        and c.aggregation.count == 0,
        "shares_window": c.window is p.member.window,
        "trust_owns": sorted(k for k in TRUST_OWNS if k in vars(c.trust)),
        "trust_on_coordinator": sorted(k for k in TRUST_OWNS if k in vars(c)),
        "trust_removed_is_banned": c.banned is c.trust.removed,
    }
    try:
        p.coordinating = False
        facts["flag_settable"] = True
    except AttributeError:
        facts["flag_settable"] = False
    p.room_changed(["p1", "p2"], "p2")
    facts.update(after=p.coordinating, dropped=p.coordinator is None, member_term=p.member.term)
    return facts


JS = r"""
const [ONLY, TRUST] = DATA;
const p = new RunPeer("p1", { window: 0 });
Object.assign(p.member, { trainer: { step: 5 }, term: 3, run: { run_id: "r".repeat(16) }, identity: {}, sha: "ab".repeat(32) });
await p.channelOpen("p2");
const lead = await p.setMembers(["p1", "p2"], "p1");
const c = p.coordinator;
const facts = {
  coordinating: p.coordinating, is_coordinator: c instanceof Coordinator,
  shares_member: c.member === p.member, same_trainer: c.trainer === p.member.trainer,
  term: p.term, announced: lead.filter((o) => o.kind === "send").map((o) => o.to),
  on_member: ONLY.filter((k) => Object.hasOwn(p.member, k)).sort(),
  on_driver: ONLY.filter((k) => Object.hasOwn(p, k)).sort(),
  on_coordinator: ONLY.filter((k) => Object.hasOwn(c, k)).sort(),
  ring_sides: [p.member.aggregation.constructor.name, c.aggregation.constructor.name,
    p.member.aggregation.star.constructor.name, c.aggregation.star.constructor.name],
  new_ring_empty: c.aggregation.ring === null && c.aggregation.plan === null && c.aggregation.count === 0,
  shares_window: c.window === p.member.window,
  trust_owns: TRUST.filter((k) => Object.hasOwn(c.trust, k)).sort(),
  trust_on_coordinator: TRUST.filter((k) => Object.hasOwn(c, k)).sort(),
  trust_removed_is_banned: c.banned === c.trust.removed,
};
try { p.coordinating = false; facts.flag_settable = true; } catch { facts.flag_settable = false; }
await p.setMembers(["p1", "p2"], "p2");
Object.assign(facts, { after: p.coordinating, dropped: p.coordinator === null, member_term: p.member.term });
console.log(JSON.stringify(facts));
"""


def test_hand_over_builds_a_coordinator_from_the_member_and_stepping_down_drops_it():
    f = python_facts()
    assert f["coordinating"] and f["is_coordinator"] and f["shares_member"] and f["same_trainer"]
    assert f["term"] == 4 and f["announced"] == ["p2"]
    assert f["on_member"] == [] and f["on_driver"] == []
    assert {"members", "tasks", "checks"} <= set(f["on_coordinator"])
    # strikes, the removed list, the window and unchecked_since: the Trust object's alone
    assert f["trust_owns"] == ["removed", "strike_count", "unchecked_since", "window"]
    assert f["trust_on_coordinator"] == [] and f["trust_removed_is_banned"]
    assert f["shares_window"] is True  # one window, the member's, across terms
    assert f["flag_settable"] is False  # coordinating is read from the roles, never set
    assert f["after"] is False and f["dropped"] and f["member_term"] == 4
    assert f["ring_sides"] == ["RingMember", "RingCoordinator", "StarMember", "Star"]
    assert f["new_ring_empty"]


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_the_js_driver_composes_the_roles_the_same_way():
    got = run_js(JS, imports={"{ Coordinator, RunPeer }": "run/index.js"}, data=[list(COORDINATOR_ONLY), list(TRUST_OWNS)])
    want = python_facts()
    # the same facts; the attribute names differ by language (members/crew, snake/camel)
    named = ("on_coordinator", "trust_owns")
    assert {k: v for k, v in got.items() if k not in named} == \
        {k: v for k, v in want.items() if k not in named}
    assert {"crew", "tasks", "checks"} <= set(got["on_coordinator"])
    assert got["trust_owns"] == ["removed", "strikeCount", "uncheckedSince", "window"]


# -- the run context (issue 39): roles read the driver through a read-only view; what they
# change of it comes back as outputs that the driver applies (before, a role wrote
# ``peer.steps``, ``peer.wait_peers = 0``, ``peer.done_by[...]`` into the driver itself)

def python_context_facts() -> dict:
    from daisychain.peer import frames as F
    from daisychain.peer.run.outputs import Committed, Log, Setting
    p = RunPeer("p1", window=0, wait_peers=2, strikes=3)
    ctx = p.member.peer
    facts = {"context": type(ctx).__name__, "shared": ctx is p.context}
    try:
        ctx.steps = 9
        facts["writable"] = True
    except AttributeError:
        facts["writable"] = False
    try:
        ctx.coordinator  # noqa: B018 - a role reaches no other role through it
        facts["reaches_roles"] = True
    except AttributeError:
        facts["reaches_roles"] = False
    out = p._applied([Setting("steps", 7), Log("kept"),
                      Committed(1, 0.5, (("p1", 2), ("p2", 3)), 2, "ab" * 32)])
    facts.update(kept=len(out), steps=p.steps, done_by=dict(p.done_by))
    try:
        p._applied([Setting("me", "p9")])
        facts["any_setting"] = True
    except ValueError:
        facts["any_setting"] = False
    # a member follows an announce: the driver takes its settings, the shell sees none of them
    p.channel_open("p2")
    p.room_changed(["p1", "p2"], "p2")
    run = F.Run({"task": "t", "dataset": "d"}, "r" * 16, 12, 1, 0, "ab" * 32, "p2", 0.25, 4, ())
    out = p.receive("p2", run)
    facts.update(run_outputs=len(out), run_settings=[p.steps, p.verify_rate, p.strikes],
                 settings_out=sum(isinstance(o, Setting) for o in out))
    return facts


JS_CONTEXT = r"""
const p = new RunPeer("p1", { window: 0, waitPeers: 2, strikes: 3 });
const ctx = p.member.peer;
const facts = { context: ctx.constructor.name, shared: ctx === p.context };
try { ctx.steps = 9; facts.writable = true; } catch { facts.writable = false; }
facts.reaches_roles = ctx.coordinator !== undefined;
let out = p._applied([{ kind: "setting", name: "steps", value: 7 }, { kind: "log", text: "kept", loud: false },
  { kind: "committed", step: 1, loss: 0.5, contributors: [["p1", 2], ["p2", 3]], mine: 2, params_sha256: "ab".repeat(32) }]);
Object.assign(facts, { kept: out.length, steps: p.steps, done_by: { ...p.doneBy } });
try { p._applied([{ kind: "setting", name: "me", value: "p9" }]); facts.any_setting = true; } catch { facts.any_setting = false; }
await p.channelOpen("p2");
await p.setMembers(["p1", "p2"], "p2");
out = await p.receive("p2", { T: "run", identity: { task: "t", dataset: "d" }, run_id: "r".repeat(16), steps: 12,
  term: 1, step: 0, params_sha256: "ab".repeat(32), coordinator: "p2", verify_rate: 0.25, strikes: 4, removed: [] });
Object.assign(facts, { run_outputs: out.length, run_settings: [p.steps, p.verifyRate, p.strikes],
  settings_out: out.filter((o) => o.kind === "setting").length });
console.log(JSON.stringify(facts));
"""


def test_roles_read_a_read_only_context_and_the_driver_applies_their_settings():
    f = python_context_facts()
    assert f["context"] == "RunContext" and f["shared"]
    assert f["writable"] is False and f["reaches_roles"] is False and f["any_setting"] is False
    assert f["kept"] == 2 and f["steps"] == 7 and f["done_by"] == {"p1": 2, "p2": 3}
    assert f["run_outputs"] == 1 and f["settings_out"] == 0  # the dataset fetch alone
    assert f["run_settings"] == [12, 0.25, 4]


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_the_js_roles_read_the_same_read_only_context():
    got = run_js(JS_CONTEXT, imports={"{ RunPeer }": "run/index.js"})
    assert got == python_context_facts()

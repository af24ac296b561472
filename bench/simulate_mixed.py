"""Mixed rooms for the simulator (``python -m bench.simulate --lang mixed``).

Each seed's room and schedule (bench/simulate.py ``generate``, unchanged) is played in two
arrangements of languages, by tests/scenarios/scenario_mixed.py (the JS replicas in one node
process, stepped by the Python side's schedule; every message crosses the encoder of one
language and the decoder of the other):

- ``js-host``: p0 (the first host, as a tab that hosts) in JS, every other replica in Python
  (daisy-peers);
- ``py-host``: p0 in Python, every other replica in JS;
- ``alternate`` (ring rooms only): p0 and every even member in Python, every odd one in JS (a
  ring of both languages, as tests/browser_mesh/test_ring_tab.py's: a daisy-peer host, a tab
  and a daisy-peer member).

Hand-overs move the coordinator to a member, so both languages coordinate in some runs. On top
of simulate's invariants, a mixed run must write the outputs of the pure Python run of the same
seed (the outputs are normalised to be language-independent; the pure runs of both languages
are held equal by ``--lang both``).

``--rooms tab-rollback`` builds, instead, rooms of the shape of
tests/browser_mesh/test_mixed_room.py::test_a_tab_hosted_room_rolls_back_a_lying_daisy_peer:
a JS host with two Python members, one honest and one ``flip`` liar, spot-checks at 0.05 (or
0.25) and 3 strikes, 32 micro-batches a step, capacities of that test's order, computes and
delays drawn wide enough that deadlines are missed and backups assigned, in 4 rooms of 10 a
member ready late (it joins by a STATE; the host then waits for nobody, as a tab), and the liar's process
exiting when it is told it was removed (its channels close, the room loses it: the sim op's
``removed_exit_ms``), as the daisy-peer does.
"""

from __future__ import annotations

import atexit
import copy
import random
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "scenarios"))

from scenario_mixed import Node, run_mixed  # noqa: E402

ARRANGEMENTS = ("js-host", "py-host", "alternate")
_node: list = []


def js_ids(sc: dict, arrangement: str) -> set:
    ids = {e["id"] for e in sc["events"] if e["op"] == "peer"}
    if arrangement == "alternate":
        return {p for p in ids if int(p[1:]) % 2 == 1}
    return {"p0"} if arrangement == "js-host" else ids - {"p0"}


def node() -> Node:
    if not _node:
        _node.append(Node())
        atexit.register(lambda: _node and _node.pop().close())
    return _node[0]


def play(sc: dict, arrangement: str) -> dict:
    """One mixed run; a raise (of either side) is its result's ``error``, as run_py's."""
    try:
        return run_mixed(copy.deepcopy(sc), js_ids(sc, arrangement), node())
    except Exception:  # noqa: BLE001 - a role that raises is a violation, reported
        if _node:  # the node side may be mid-answer: start a fresh one for the next run
            _node.pop().proc.kill()
        return {"error": traceback.format_exc(), "outputs": [], "final": {}}


def mixed_violations(sc: dict, py: dict | None) -> tuple[list[str], dict]:
    """simulate's invariants on each arrangement's run (a tab-rollback room: js-host only;
    alternate: ring rooms only), and its outputs against the pure Python run ``py``; the last
    run's result with them."""
    from bench.simulate import first_difference, violations
    bad: list[str] = []
    res: dict = {}
    ring = sc.get("sim", {}).get("shape") == "ring"
    for a in ARRANGEMENTS[:1] if sc["name"].startswith("tab") else ARRANGEMENTS if ring else ARRANGEMENTS[:2]:
        res = play(sc, a)
        bad += [f"mixed {a}: {v}" for v in violations(sc, res)]
        if py is not None and "error" not in py and "error" not in res and (
                py["outputs"] != res["outputs"] or py["final"] != res["final"]):
            bad.append(f"mixed {a}: outputs differ from the pure python run: "
                       + first_difference(py["outputs"], res["outputs"]))
    return bad, res


#: the tab-rollback rooms' run settings: 32 micro-batches a step, as the browser test's
TAB = ["--hidden", "8", "--batch", "64", "--micro-batch", "2"]


def generate_tab(seed: int) -> dict:
    """A room of the tab-rollback test's shape (module doc), as a scenario."""
    r = random.Random(f"tab{seed}")
    steps = r.randint(6, 24)
    rate = r.choice([0.05, 0.05, 0.05, 0.25])
    liar = r.choice(["p1", "p2"])
    host_cap = float(r.choice([300, 1000, 2000, 4000, 8000]))
    events = [{"op": "peer", "id": p, "capacity": host_cap if p == "p0" else 2000.0, "verify_rate": rate,
               "strikes": 3, "verify_key": f"tab{seed}", **({"host": True, "wait_peers": 2} if p == "p0" else {}),
               **({"fault": "flip"} if p == liar else {})} for p in ("p0", "p1", "p2")]
    # computes and delays of a loaded machine: a peer's times wide, some of them past a deadline
    slow = {p: [r.choice([1, 5, 20]), r.choice([60, 400, 1500, 4000])] for p in ("p0", "p1", "p2") if r.random() < 0.7}
    at = [[0, {"op": "room", "members": ["p0", "p1", "p2"], "host": "p0"}],
          [0, {"op": "link", "peers": ["p0", "p1", "p2"]}], [0, {"op": "start", "id": "p0"}]]
    late = []
    if r.random() < 0.4:  # (drawn last: the rooms without it are those of the first sweep)
        # a member ready late, as a daisy-peer on a loaded machine: the tab (which waits for
        # nobody: waitPeers 0) waits START_WAIT_S for its announce, then goes on; it joins by a STATE
        late = [r.choice(["p1", "p2"])]
        first = [p for p in ("p0", "p1", "p2") if p not in late]
        events[0]["wait_peers"] = 0
        t = r.randint(500, 20_000)
        at = [[0, {"op": "room", "members": first, "host": "p0"}], [0, {"op": "link", "peers": first}],
              [0, {"op": "start", "id": "p0"}], [t, {"op": "room", "members": ["p0", "p1", "p2"], "host": "p0"}],
              [t, {"op": "link", "peers": ["p0", "p1", "p2"]}]]
    # (30 min of virtual time: a slow member given backups piles up computes of up to 4 s each;
    # seed 2219 ended at 634 s, past an earlier bound of 600 s)
    sim = {"op": "sim", "rng": (seed * 2654435761 + 777) % 2**32 or 1,
           "delay_ms": r.choice([[1, 5], [1, 50], [5, 400], [1, 1500]]), "compute_default_ms": [5, 60],
           "compute_ms": slow, "tick_ms": 100, "until_ms": 1_800_000, "at": at,
           "removed_exit_ms": r.choice([[1, 20], [5, 400], [50, 3000]])}  # the liar's process exits
    return {"name": f"tab{seed}", "seed": seed, "settings": TAB + ["--steps", str(steps)], "events": events + [sim],
            "sim": {"shape": "star", "peers": 3, "steps": steps, "verify_rate": rate, "strikes": 3,
                    "liars": {liar: "flip"}, "late": late, "slow": sorted(slow), "events": []}}

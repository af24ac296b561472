"""The rollback window (daisychain/peer/run/rollback.py, webui/run/rollback.js): its size from
the verify rate and strikes is the smallest with a liar's escape probability under 10^-6
(checked against exact binomial sums), the same in Python and JS; and going back within
it gives the bits the replica had at that step."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from math import comb

import numpy as np
import pytest

from daisychain.engine.trainer import params_sha256
from daisychain.peer.run.rollback import ESCAPE, Window, escape_probability, window_steps
from jsrun import run_js

GRID = [(r, s) for r in (1.0, 0.5, 0.25, 0.1, 0.05, 0.02, 0.01) for s in (1, 2, 3, 5)] + [
    (0.0, 3), (0.5, 1000), (0.3, 200), (1e-9, 1000), (0.0101, 1000)]


def escape(k: int, rate: float, strikes: int) -> Fraction:
    """P(fewer than ``strikes`` of k steps checked), exactly."""
    r = Fraction(rate)
    return sum(comb(k, i) * r**i * (1 - r) ** (k - i) for i in range(strikes))


@pytest.mark.parametrize("rate,strikes", [g for g in GRID if 0 < g[0] < 1 and g[0] >= 0.05])
def test_the_window_is_the_smallest_with_escape_under_the_bound(rate, strikes):
    k = window_steps(rate, strikes)
    assert escape(k, rate, strikes) < ESCAPE <= escape(k - 1, rate, strikes)


def test_many_strikes_do_not_underflow_the_window():
    """1000 strikes at rate 1/2: the window is where fewer than 1000 of k fair coin flips
    come up checked with probability < 10^-6 (about 2223). A product of the terms underflowed
    (0.5^k is 0 past k = 1074) and gave 1075, where the escape is almost certain."""
    k = window_steps(0.5, 1000)
    p = lambda n: Fraction(sum(comb(n, i) for i in range(1000)), 2**n)  # noqa: E731
    assert p(k) < ESCAPE <= p(k - 1)


def test_a_window_never_reachable_is_the_largest():
    from daisychain.peer.run.rollback import MAX_WINDOW
    assert window_steps(1e-9, 1000) == MAX_WINDOW == window_steps(0.0101, 1000)


def test_no_checks_no_window_and_rate_one_is_the_strikes():
    assert window_steps(0.0, 3) == 0
    assert window_steps(1.0, 3) == 3


CASES = json.loads((Path(__file__).parents[1] / "data" / "window_cases.json").read_text())["cases"]


def test_window_sizes_are_the_shared_data():
    """tests/data/window_cases.json (rates 1e-4..1, strikes 1..10, what an announce may
    carry, random ones) is the definition of the window's size: Python gives each exactly."""
    assert len(CASES) > 400
    assert [window_steps(r, s) for r, s, _ in CASES] == [k for _, _, k in CASES]


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_js_window_sizes_are_the_shared_data():
    got = run_js("console.log(JSON.stringify(DATA.map(([r, s]) => windowSteps(r, s))));",
                 imports={"{ windowSteps }": "run/rollback.js"}, data=[[r, s] for r, s, _ in CASES])
    assert got == [k for _, _, k in CASES]


PROBES = [(k, r, s) for k in (1, 7, 68, 183, 374, 2223, 100_000) for r, s in
          ((0.25, 3), (0.1, 3), (0.05, 3), (0.5, 1000), (1e-4, 10), (0.9999999999999999, 5))]


@pytest.mark.usefixtures("node")
def test_python_and_js_escape_probabilities_are_the_same_bits():
    """The scaled escape probability itself (mantissa and power of two), not only the window
    it gives: the same floats in both languages (JSON carries doubles exactly)."""
    got = run_js("console.log(JSON.stringify(DATA.map(([k, r, s]) => escapeProbability(k, r, s))));",
                 imports={"{ escapeProbability }": "run/rollback.js"}, data=PROBES)
    assert got == [list(escape_probability(k, r, s)) for k, r, s in PROBES]


def test_escape_probability_is_close_to_the_exact_sum():
    for k, r, s in [(68, 0.25, 3), (183, 0.1, 3), (374, 0.05, 3), (2223, 0.5, 1000), (40, 0.3, 10)]:
        m, e = escape_probability(k, r, s)
        exact = escape(k, r, s)
        assert abs(Fraction(m) * Fraction(2) ** e - exact) <= exact * Fraction(1, 10**9)


def test_a_subnormal_rate_gives_the_largest_window():
    """A run announce may carry any rate in [0, 1]: at 5e-324 with 1000 strikes, the median
    count (strikes - 1) / rate is infinite, and Python's window_steps raised OverflowError
    (math.floor of inf) where the JS gave MAX_WINDOW: a member taking over such a run crashed."""
    from daisychain.peer.run.rollback import MAX_WINDOW
    assert window_steps(5e-324, 1000) == MAX_WINDOW


def test_the_window_uses_no_library_log_or_exp():
    """DETERMINISM.md rule 7: the size is computed with + - * / and comparisons only."""
    import re
    from daisychain import package_path
    for f in (package_path("peer") / "run" / "rollback.py", package_path("webui") / "run" / "rollback.js"):
        src = f.read_text()
        assert not re.search(r"\b(math|Math|np|numpy)\.(log|log1p|log2|log10|exp|expm1|pow)\b", src), f


def test_going_back_gives_the_bits_of_that_step():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "scenarios"))
    from scenario_net import settings
    from daisychain.engine.trainer import Trainer
    from daisychain.units import load_luts
    rs = settings(("--hidden", "8", "--batch", "8", "--micro-batch", "2", "--steps", "6"))
    tr = Trainer(rs.spec, rs.hp, rs.ds, load_luts())
    w = Window(3)
    w.reset(tr)
    seen = {}
    for step in range(6):
        seen[step] = tr.snapshot()
        total = tr.contribute(range(rs.hp.n_micro)).grad
        tr.apply(total)
        w.record(tr, step, total, {"p1"} if step >= 2 else set())
    assert w.first == 3 and w.earliest("p1") == 3  # steps 0..2 folded into the snapshot
    end = tr.snapshot()
    w.go_back(tr, 4)
    assert tr.state.step == 4 and tr.params_sha256() == params_sha256(seen[4].theta)
    assert np.array_equal(tr.state.adam.m, seen[4].adam.m) and np.array_equal(tr.state.adam.v, seen[4].adam.v)
    assert not np.array_equal(tr.theta, end.theta)
    assert w.earliest("p1") == 3 and [s.step for s in w.steps] == [3]



def test_the_window_holds_no_more_than_its_bytes():
    """A window sized for many steps (a tiny rate) is held to max_bytes of totals: past it,
    the oldest quarter is folded into the snapshot, and going back still gives the bits."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "scenarios"))
    from scenario_net import settings
    from daisychain.engine.trainer import Trainer
    from daisychain.peer.run.state import tensor_bounds
    from daisychain.units import load_luts
    rs = settings(("--hidden", "8", "--batch", "8", "--micro-batch", "2", "--steps", "12"))
    tr = Trainer(rs.spec, rs.hp, rs.ds, load_luts())
    w = Window(1000, tensor_bounds(tr), max_bytes=2000)   # 1000 steps, 2000 bytes: a few steps
    w.reset(tr)
    seen = {}
    for step in range(12):
        seen[step] = tr.snapshot()
        total = tr.contribute(range(rs.hp.n_micro)).grad
        tr.apply(total)
        w.record(tr, step, total, {"p1"})
        assert w.steps and w.held == sum(len(s.body) for s in w.steps) <= 2000
    first = w.first
    assert 6 <= first < 12 and w.earliest("p1") == first  # the oldest were folded
    w.go_back(tr, first + 1)
    assert tr.params_sha256() == params_sha256(seen[first + 1].theta)

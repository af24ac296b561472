"""The peer self-test (daisychain/peer/selftest.py): the golden unit vectors, one Adam step on
the golden Adam vectors and the golden subnormal operations; the committed golden file is
what the reference code writes; a tampered or malformed vector fails in words. The same
vectors through the tab's conformance.js, in node."""

from __future__ import annotations

import copy
import json

import pytest

from daisychain import package_path
from daisychain.peer import selftest as S
from daisychain.units import load_luts
from jsrun import run_js


@pytest.fixture(scope="module")
def luts():
    return load_luts()


@pytest.fixture(scope="module")
def golden():
    return json.loads(package_path("golden", S.GOLDEN_FILE).read_text())


def test_committed_golden_file_is_current():
    assert package_path("golden", S.GOLDEN_FILE).read_text() == S.golden_text(), \
        "rewrite it: python -m daisychain.peer.selftest"


def test_the_vectors_hold_what_they_claim(golden):
    """Subnormals in the Adam inputs and outputs and in every subnormal operation."""
    tiny = 2.2250738585072014e-308
    sub = lambda xs: [x for x in S.unhex(xs) if 0 < abs(x) < tiny]  # noqa: E731
    case = golden["adam"][0]
    assert sub(case["g"]) and sub(case["m"]) and sub(case["v"]) and sub(case["out"]["v"])
    for c in golden["subnormal"]:
        assert sub([c["a"], c["b"], c["out"]]), c
    assert {c["hyper"]["weight_decay"] > 0 for c in golden["adam"]} == {False, True}


def test_selftest_passes_on_the_committed_vectors(luts):
    assert S.selftest(luts) == (True, "ok")


def test_a_tampered_adam_vector_fails_in_words(luts, golden):
    g = copy.deepcopy(golden)
    g["adam"][0]["out"]["v"][2] = "0000000000000000"  # v[2] is subnormal: as if flushed
    g["adam"][0]["out"]["v_sha256"] = "0" * 64
    ok, why = S.selftest(luts, golden=g)
    assert not ok
    assert why.startswith("Adam step (default hyper, step 4): v hashes to "), why
    assert why.endswith("(v[2] is 00000000000315d8 here, golden 0000000000000000)"), why


def test_a_tampered_subnormal_vector_fails_in_words(luts, golden):
    g = copy.deepcopy(golden)
    g["subnormal"][1]["out"] = "0000000000000000"
    ok, why = S.selftest(luts, golden=g)
    assert not ok
    assert why == ("subnormals: mul(1eb67e9c127b6e74, 1eb67e9c127b6e74) is 00000000000007e8 "
                   "here, golden 0000000000000000"), why


def test_a_flushed_result_is_named(luts, golden):
    g = copy.deepcopy(golden)
    g["subnormal"][0]["a"] = "0000000000000000"  # 0 * 2 is 0, golden says 1e-323
    ok, why = S.selftest(luts, golden=g)
    assert not ok and why.endswith("(flushed to zero)"), why


@pytest.mark.parametrize("breakage", ["no adam", "bad hex", "short", "not a list"])
def test_malformed_golden_vectors_fail_in_words(luts, golden, breakage):
    g = copy.deepcopy(golden)
    if breakage == "no adam":
        del g["adam"]
    elif breakage == "bad hex":
        g["adam"][1]["theta"][0] = "zz" * 8
    elif breakage == "short":
        g["adam"][0]["g"] = g["adam"][0]["g"][:-1]
    else:
        g["subnormal"] = 7
    ok, why = S.selftest(luts, golden=g)
    assert not ok and why and "malformed" in why, why


def test_a_tampered_unit_vector_still_fails(luts):
    u = json.loads(package_path("golden", "units.json").read_text())
    u["relu"]["out"][0] += 1
    ok, why = S.selftest(luts, units=u)
    assert not ok and why == "relu unit: 1 of 256 outputs differ", why


def js_float_failures(golden) -> list[str]:
    return run_js("console.log(JSON.stringify(await C.floatFailures(DATA)));",
                  imports={"C": "engine/conformance.js"}, data=golden)


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_the_tab_runs_the_same_vectors(golden, luts):
    """conformance.js passes the committed vectors and fails the tampered ones with the same
    words as the Python self-test."""
    assert js_float_failures(golden) == []
    for tamper in ("adam", "subnormal"):
        g = copy.deepcopy(golden)
        if tamper == "adam":
            g["adam"][0]["theta"][5] = f"{int(g['adam'][0]['theta'][5], 16) ^ 1:016x}"  # 1 ulp
        else:
            g["subnormal"][1]["out"] = "0000000000000000"
        js = js_float_failures(g)
        ok, py = S.selftest(luts, golden=g)
        assert len(js) == 1 and js[0] == py, (js, py)
    g = copy.deepcopy(golden)
    g["adam"][1]["theta"][0] = "zz" * 8
    js = js_float_failures(g)
    assert len(js) == 1 and "malformed" in js[0], js

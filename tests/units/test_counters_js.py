"""counters.js (the page's unit-invocation counters) against engine/counters.py, on shared
data: tests/data/unit_counts.json holds model shapes x micro-batch counts -> counts made by the
Python formula; Node computes the same cases with counters.js and must give the same numbers.
Regenerate the file with ``python tests/units/test_counters_js.py --write``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from daisychain.engine.counters import unit_counts  # noqa: E402
from daisychain.engine.spec import DEFAULT_CNN, Layer, ModelSpec, char_mlp, cnn, mlp  # noqa: E402
from jsrun import run_js  # noqa: E402

DATA = Path(__file__).parents[1] / "data" / "unit_counts.json"


def _specs() -> dict[str, ModelSpec]:
    return {"digits-128": mlp(64, 128, 10), "digits-256x256": mlp(64, [256, 256], 10),
            "mnist-3layers": mlp(784, [512, 256, 128], 10),
            "linear": ModelSpec((Layer("linear", 5, 4),), "dense", 5, 4),
            "text-char": char_mlp(96, 16, 16, 128), "text-char-2layers": char_mlp(80, 8, 8, [64, 32]),
            "wide": mlp(1024, [4096, 4096, 2048], 1000),
            # conv layers (the page used to count only linears: a CNN's convolutions were missing)
            "mnist-cnn": cnn((1, 28, 28), DEFAULT_CNN, 10),
            "rgb-cnn": cnn((3, 32, 32), ("conv8k5", "pool", "conv16", "pool", 32), 10),
            # transformers (issue 37): the blocks' multiply/requantize/ReLU and the exp unit
            "gpt-2blocks": _gpt(45, 64, 4, 32, 256, 2), "gpt-tiny": _gpt(96, 16, 2, 8, 64, 1)}


def _gpt(vocab: int, dim: int, heads: int, context: int, mlp_units: int, blocks: int) -> ModelSpec:
    """The text transformer's spec (engine/data.py model_for with --layers blockWhH)."""
    block = {"type": "block", "dim": dim, "heads": heads, "context": context, "mlp": mlp_units}
    return ModelSpec.from_json({
        "input": {"kind": "tokens", "dim": context}, "classes": vocab,
        "layers": [{"type": "embedding", "vocab": vocab, "dim": dim},
                   {"type": "posembed", "context": context, "dim": dim}] + [block] * blocks
        + [{"type": "rmsnorm", "dim": dim, "context": context}, {"type": "linear", "in": dim, "out": vocab}]})


def cases() -> list[dict]:
    out = []
    for name, spec in _specs().items():
        for b in (1, 16, 64):
            for n in (0, 1, 4, 2400, 1_000_000):
                out.append({"name": name, "model": spec.to_json(), "micro_batch": b,
                            "micro_batches": n, "counts": unit_counts(spec, b, n)})
    return out


def test_shared_data_is_the_python_formula():
    """The checked-in cases are what engine/counters.py computes today."""
    assert json.loads(DATA.read_text()) == cases()


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_counters_js_equals_python_on_the_shared_data():
    got = run_js("""
const cases = JSON.parse(readFileSync(DATA, "utf8"));
const out = cases.map(c => ({
  json: unitCounts(c.model, c.micro_batch, c.micro_batches),
  spec: unitCounts(ModelSpec.fromJson(c.model), c.micro_batch, c.micro_batches),
}));
console.log(JSON.stringify(out));
""", imports={"{ unitCounts }": "engine/counters.js", "{ ModelSpec }": "engine/spec.js"}, data=str(DATA))
    want = json.loads(DATA.read_text())
    assert len(got) == len(want) > 0
    for g, c in zip(got, want):
        assert g["json"] == c["counts"], c["name"]
        assert g["spec"] == c["counts"], c["name"]
    # the data reaches past 2^53 only where a double must round; below it the JS is exact
    assert any(max(c["counts"].values()) > 2**40 for c in want)


if __name__ == "__main__" and "--write" in sys.argv:
    DATA.write_text(json.dumps(cases(), indent=1) + "\n")

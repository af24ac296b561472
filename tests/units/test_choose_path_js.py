"""Unit tier (node): gpu.js choosePath, the rule that makes a tab compute on its faster
passing path, and the words it says why in."""

from __future__ import annotations

import pytest

from jsrun import run_js

pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node

DRIVER = r"""
const out = [];
for (const c of DATA) {
  try { out.push(choosePath(c)); } catch (e) { out.push({ error: e.message }); }
}
console.log(JSON.stringify(out));
"""

CASES = [
    ({"rates": {"gpu": 29.5, "cpu": 1064}}, "cpu",
     "WebGPU passed but is 36× slower than the JS units here: computing on the JS units"),
    ({"rates": {"gpu": 3000, "cpu": 1000}, "adapter": "nvidia ampere"}, "gpu",
     "WebGPU passed its self-test (nvidia ampere) and is 3.0× faster than the JS units here: computing on WebGPU"),
    ({"rates": {"gpu": 29.5, "cpu": 1064}, "want": "gpu"}, "gpu",
     "WebGPU passed its self-test and is 36× slower than the JS units here: computing on WebGPU, as asked (path=gpu)"),
    ({"rates": {"gpu": 2000, "cpu": 1000}, "want": "cpu"}, "cpu",
     "WebGPU passed its self-test and is 2.0× faster than the JS units here: computing on the JS units, as asked (path=cpu)"),
    ({"rates": {"gpu": None, "cpu": 900}, "gpuWhy": "requestAdapter() returned null"}, "cpu",
     "no WebGPU: requestAdapter() returned null; the JS units passed their self-test"),
    ({"rates": {"gpu": None, "cpu": 900}, "want": "cpu"}, "cpu",
     "the CPU path was chosen; the JS units passed their self-test"),
    ({"rates": {"gpu": 50, "cpu": None}, "cpuWhy": "gemm 1x1x1"}, "gpu",
     "WebGPU passed its self-test; the JS units failed theirs (gemm 1x1x1): computing on WebGPU"),
]


def test_choose_path_takes_the_faster_passing_path_and_says_why():
    cases = [c for c, _, _ in CASES] + [{"rates": {"gpu": None, "cpu": None}, "cpuWhy": "mul"}]
    got = run_js(DRIVER, imports={"{ choosePath }": "units/gpu.js"}, data=cases)
    for (case, path, reason), have in zip(CASES, got):
        assert have["path"] == path, (case, have)
        assert have["reason"] == reason
    assert "cannot train" in got[-1]["error"]

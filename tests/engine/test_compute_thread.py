"""A peer's compute thread runs BLAS on one thread: with OpenBLAS's own worker threads, the
small GEMMs of a step called from that thread waited on them (bench/mesh.py's 1-peer row
showed 59 ms of compute for a step that takes ~1 ms in ``daisychain train``)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_compute_thread_limits_blas_to_one_thread():
    code = """
import os
os.environ.pop("OPENBLAS_NUM_THREADS", None); os.environ.pop("OMP_NUM_THREADS", None)
import numpy as np
from threadpoolctl import threadpool_info
from daisychain.peer import node
from daisychain.engine.data import prepare_task
from daisychain.engine.spec import Hyper, mlp
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts
from daisychain.peer.run import contribute_at
tr = Trainer(mlp(64, 32, 10), Hyper(), prepare_task("digits"), load_luts())
before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
res = node._COMPUTE.submit(contribute_at, tr, tr.theta.copy(), 0, [0, 1]).result()
after = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
import json
print(json.dumps({"before": before, "after": after, "cpus": os.cpu_count()}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["after"] and set(got["after"]) == {1}, got

"""examples/ runs as a user runs it: the notebook-style quickstart trains, evaluates, predicts,
saves, exports and resumes on the command line's hashes; examples/my_task.py (a task of
your own: regression with mse) trains to one hash from ``daisychain train --task`` and from
the API; a task that cannot be used gets one line. The 2-peer demo of the same task is in
tests/mesh/test_my_task_demo.py. Functional tier (subprocesses, no network)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TASK = "examples.my_task:MyTask"


def cli(*argv, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daisychain.cli", *argv], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def cli_hash(*argv) -> str:
    r = cli("train", *argv, "--json", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)["params_sha256"]


def test_quickstart_runs_on_the_command_lines_hashes(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py"), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["files"] == ["digits.pt", "digits.safetensors"]
    assert got["accuracy"] > 0.9 and len(got["predicted"]) == 8
    assert got["digits"] == cli_hash("--layers", "64", "--steps", "200")
    assert got["resumed"] == cli_hash("--layers", "64", "--steps", "300")
    assert got["my_task"] == cli_hash("--task", TASK, "--steps", "300")
    assert got["my_task_mse"] < 0.6  # the targets' spread is about 1
    assert "refused: lr must be a finite number in (0, 1]" in r.stdout


def test_my_task_train_and_api_give_one_hash():
    import daisychain as dc
    sys.path.insert(0, str(ROOT))
    try:
        from examples.my_task import MyTask
    finally:
        sys.path.remove(str(ROOT))
    r = cli("train", "--task", TASK, "--steps", "40", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    api = dc.train(None, MyTask(), steps=40)
    assert api.params_sha256 == out["params_sha256"] and api.run_id == out["run_id"]
    assert dc.train(None, MyTask, steps=40).params_sha256 == api.params_sha256  # the class too
    assert out["identity"]["model"]["loss"] == "mse" and out["identity"]["task"] == "mytask"
    assert out["test_mse"] == api.test_mse
    human = cli("train", "--task", TASK, "--steps", "40", "--quiet")
    assert "test mse: " in human.stdout and "test accuracy" not in human.stdout


BAD = {
    "no_import.py": ("import no_such_module_here\n", "no_import:T",
                     "cannot import no_import: ModuleNotFoundError: No module named 'no_such_module_here'"),
    "no_member.py": ("class T:\n    layers = '8'\n    loss = 'mse'\n", "no_member:T",
                     "the task has no data (a task needs layers, loss and data())"),
    "no_class.py": ("x = 1\n", "no_class:T", "no_class has no member 'T'"),
    "bad_loss.py": ("class T:\n    layers = '8'\n    loss = 'hinge'\n    def data(self): pass\n",
                    "bad_loss:T", "loss must be one of cross_entropy, mse, not 'hinge'"),
    "bad_shape.py": ("import numpy as np\nclass T:\n    layers = '8'\n    loss = 'mse'\n"
                     "    def data(self):\n        return np.zeros((8, 2, 2)), np.zeros(8), np.zeros((2, 4)), np.zeros(2)\n",
                     "bad_shape:T", "x_train must be (rows, features)"),
    "bad_labels.py": ("import numpy as np\nclass T:\n    layers = '8'\n    loss = 'cross_entropy'\n"
                      "    def data(self):\n        return np.zeros((8, 2)), np.full(8, 0.5), np.zeros((2, 2)), np.zeros(2)\n",
                      "bad_labels:T", "y_train for cross_entropy must be (rows,) whole-number class ids"),
    "raises.py": ("class T:\n    layers = '8'\n    loss = 'mse'\n    def data(self):\n        raise OSError('disk gone')\n",
                  "raises:T", "data() failed: OSError: disk gone"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_task_that_cannot_be_used_gets_one_line(tmp_path, name):
    source, ref, words = BAD[name]
    (tmp_path / name).write_text(source)
    r = cli("train", "--task", ref, "--steps", "2", cwd=tmp_path)
    assert r.returncode == 2
    err = r.stderr.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"daisychain train: error: --task {ref}") and words in err, err


def test_task_with_data_flag_is_refused():
    r = cli("train", "--task", TASK, "--data", "x.txt", "--steps", "2")
    assert r.returncode == 2 and "--data applies to the built-in tasks" in r.stderr


def test_cluster_two_ranks_train_my_task_to_trains_hash():
    """``daisychain cluster --task module:Name`` under torchrun: every rank imports the task."""
    import os
    import re

    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    torchrun = Path(sys.executable).parent / "torchrun"
    r = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "daisychain.cluster",
                        "--quiet", "--task", TASK, "--steps", "20"], capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = re.findall(r"params-sha256: ([0-9a-f]{64})", r.stdout + r.stderr)
    assert got and got[-1] == cli_hash("--task", TASK, "--steps", "20")
    assert "test mse: " in r.stdout + r.stderr

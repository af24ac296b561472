"""``--threads N`` (issue 33, item 2): a step's micro-batches computed on N threads end on
the same params-sha256 for every N (the threads' fixed-point sums are exact integers), on the
digits MLP and on an image CNN; ``--threads 0``, ``-1`` and ``abc`` are refused in one line;
more threads than cores is allowed and the log says so; the capacity probe runs as many
micro-batches at once as there are threads. (demo and daisy-peer: tests/mesh/test_threads_mesh.py)"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from daisychain.engine.data import prepare_task
from daisychain.engine.spec import Hyper, cnn
from daisychain.engine.threads import ThreadedGrad, cores, threads_arg
from daisychain.engine.trainer import Trainer
from daisychain.units import load_luts

IMAGE = ["--task", "image", "--image-size", "8", "--layers", "conv4,pool,16", "--batch", "32",
         "--micro-batch", "8", "--seed", "3"]


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daisychain.cli", "train", "--json", "--quiet", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("argv", [["--task", "digits", "--steps", "8", "--layers", "32,16"], [*IMAGE, "--steps", "3"]],
                         ids=["digits", "image"])
def test_every_thread_count_gives_the_same_hash(argv):
    outs = []
    for n in (1, 2, 3):
        r = _train(*argv, "--threads", str(n))
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert [o["threads"] for o in outs] == [1, 2, 3]
    assert [o["threads_used"] for o in outs][0] == 1 and all(1 <= o["threads_used"] <= o["threads"] for o in outs)
    assert len({o["params_sha256"] for o in outs}) == 1, [o["params_sha256"] for o in outs]


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "1.5", ""])
def test_bad_thread_counts_are_refused_in_one_line(bad):
    r = _train("--task", "digits", "--steps", "1", f"--threads={bad}")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert lines[-1] == (f"daisychain train: error: --threads must be a whole number in [1, 256] (default: "
                         f"this machine's {cores()} cores), not {bad!r} (see daisychain train --help)"), r.stderr


def test_more_threads_than_cores_is_allowed_and_said():
    n = cores() + 1
    r = _train("--task", "digits", "--steps", "2", "--threads", str(n))
    assert r.returncode == 0, r.stderr
    assert (f"daisychain train: --threads {n} is more than this machine's {cores()} cores: allowed, "
            "the threads share them") in r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["threads"] == n


def test_the_default_is_the_cores():
    r = _train("--task", "digits", "--steps", "1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["threads"] == cores()
    assert "more than this machine" not in r.stderr


def test_threaded_grad_equals_one_engine_per_micro_batch():
    """The merge: the threads' sums and per-micro-batch loss / correct, in micro order, equal
    one engine's over all micro-batches, and each thread has an engine of its own."""
    ds = prepare_task("image", image_size=8)
    hp = Hyper(batch=48, micro_batch=8, seed=5)
    one = Trainer(cnn((1, 8, 8), ["conv4", "pool", 16], 10), hp, ds, load_luts(), threads=1)
    three = Trainer(one.spec, hp, ds, load_luts(), threads=3)
    three.threads.min_share_s = 0  # split however cheap the micro-batches (the rule: below)
    three.threads.mode = "threads"  # the in-process path (the processes': test_the_process_path_...)
    ids = list(range(hp.n_micro))
    a, b = one.contribute(ids, 2), three.contribute(ids, 2)
    assert np.array_equal(a.grad, b.grad) and np.array_equal(a.loss, b.loss) and np.array_equal(a.correct, b.correct)
    assert isinstance(three.threads, ThreadedGrad) and len({id(e) for e in three.threads._engines}) == 3
    assert threads_arg(" 4 ") == 4


def test_cheap_micro_batches_stay_on_one_thread_and_dear_ones_are_split():
    """A split costs more than a second core gives when a thread's share is cheap (digits ran
    at 0.55x on 2 threads): the pool takes a call only when each share would take at least
    min_share_s on one thread, by the rate measured on this process's own calls."""
    ds = prepare_task("digits")
    hp = Hyper(batch=64, micro_batch=16, seed=1)
    from daisychain.engine.spec import mlp

    tr = Trainer(mlp(64, [32], 10), hp, ds, load_luts(), threads=2)
    g = tr.threads
    assert g.split(4) == 1 and g.per_micro_s is None  # nothing measured yet: one thread
    ids = list(range(hp.n_micro))
    first = tr.contribute(ids, 0)
    assert g.per_micro_s is not None and g.per_micro_s > 0
    for _ in range(3):
        assert np.array_equal(tr.contribute(ids, 0).grad, first.grad)
    assert g._workers == [] and g.most_used == 1  # a cheap run never starts a worker process
    g.per_micro_s = 1e-4  # ~ a digits micro-batch here: shares of 0.2 ms
    assert g.split(4) == 1
    g.per_micro_s = g.min_share_s  # each micro-batch worth a share: as many threads as allowed
    assert g.split(4) == 2 and g.split(1) == 1
    g.per_micro_s = 0.75 * g.min_share_s  # 4 x 0.75 = 3 shares' worth, capped at 2 threads
    assert g.split(4) == 2 and g.split(2) == 1
    assert np.array_equal(first.grad, tr.contribute(ids, 0).grad)  # starts the worker, computes alone
    assert g.most_used == 1 and len(g._workers) == 1 and g.wait_ready()
    g.per_micro_s = 0.75 * g.min_share_s  # (the call alone measured the true, cheap rate)
    again = tr.contribute(ids, 0)  # split on 2 processes now: the same bits
    assert g.most_used == 2 and g.most_procs == 1 and np.array_equal(first.grad, again.grad)
    tr.threads.close()
    assert g.per_micro_s <= 0.75 * g.min_share_s  # the split call's wall time only lowers it


def test_the_tabs_pool_splits_by_the_same_rule():
    """engine/threads.py threads_for and the tab's workersFor (trainer_proxy.js, its default
    pool; `?workers=N` asks for all N) give the same counts on one table of cases."""
    from daisychain.engine.threads import MIN_SHARE_S, threads_for
    from jsrun import run_js

    cases = [(n, size, ms) for n in (1, 2, 3, 4, 7, 16) for size in (1, 2, 3, 8)
             for ms in (None, 0.07, 0.3, 0.9, 1.3, 2.6, 7.7, 40.0)]
    want = [threads_for(n, size, None if ms is None else ms / 1000, MIN_SHARE_S) for n, size, ms in cases]
    out = run_js("console.log(JSON.stringify({ ms: P.MIN_SHARE_MS, "
                 "got: DATA.map(([n, s, ms]) => P.workersFor(n, s, false, ms)), "
                 "asked: DATA.map(([n, s, ms]) => P.workersFor(n, s, true, ms)) }));",
                 imports={"P": "shell/worker/trainer_proxy.js"}, data=cases)
    assert out["ms"] == MIN_SHARE_S * 1000
    assert out["got"] == want
    assert out["asked"] == [min(n, size) for n, size, _ in cases]
    assert 1 in want and 2 in want and 8 in want  # the table reaches every branch


def test_the_tabs_pull_runs():
    """The runs a tab's workers pull (trainer_proxy.js pullRun): a quarter of an even share
    while a micro-batch's cost is unknown or above the 2 ms share, at least 2 ms of work where
    micro-batches are cheaper, never more than an even share; the runs cover the call."""
    from jsrun import run_js

    cases = [(4, 2, None), (16, 2, None), (1, 2, None), (4, 2, 7.0), (16, 2, 6.5), (4, 2, 0.1),
             (16, 2, 0.5), (16, 2, 0.1), (16, 3, 0.7)]
    out = run_js("console.log(JSON.stringify({ runs: DATA.map(([l, n, ms]) => P.pullRun(l, n, ms)), "
                 "cover: DATA.map(([l, n, ms]) => { const r = []; for (let left = l; left > 0; left -= r[r.length - 1]) "
                 "r.push(P.pullRun(left, n, ms)); return r; }) }));",
                 imports={"P": "shell/worker/trainer_proxy.js"}, data=cases)
    assert out["runs"] == [1, 4, 1, 1, 4, 2, 4, 8, 3]
    assert [sum(r) for r in out["cover"]] == [c[0] for c in cases]
    assert out["cover"][1] == [4, 3, 2, 1, 1, 1, 1, 1, 1, 1]  # the last runs one micro-batch each


@pytest.mark.parametrize("n", [1, 2, 3])
def test_cluster_on_n_threads_matches_train(n):
    """`daisychain cluster` (world size one, the Gloo group of its own) on 1, 2, 3 threads."""
    import os
    import re

    settings = ["--steps", "6", "--seed", "5", "--layers", "32,16"]
    want = json.loads(_train(*settings).stdout.strip().splitlines()[-1])["params_sha256"]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    r = subprocess.run([sys.executable, "-m", "daisychain.cluster", "--quiet", *settings, "--threads", str(n)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.findall(r"params-sha256: ([0-9a-f]{64})", r.stdout)[-1] == want


def _image_pair(threads: int, **kw):
    ds = prepare_task("image", image_size=8)
    hp = Hyper(batch=48, micro_batch=8, seed=5, augment_shift=1)
    one = Trainer(cnn((1, 8, 8), ["conv4", "pool", 16], 10), hp, ds, load_luts(), threads=1)
    many = Trainer(one.spec, hp, ds, load_luts(), threads=threads)
    many.threads.min_share_s = 0  # split however cheap the micro-batches
    for k, v in kw.items():
        setattr(many.threads, k, v)
    return one, many


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped) is gone too
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.parametrize("threads,parent_computes,procs", [(2, True, 1), (3, True, 2), (2, False, 2)],
                         ids=["caller+1", "caller+2", "2-workers"])
def test_the_process_path_computes_split_calls_with_the_same_bits(threads, parent_computes, procs):
    """--threads N computes a split call's shares in worker processes (the caller and N-1
    workers, or N workers): started on the first split call (which the caller computes alone
    meanwhile), then every step's contribution, loss and correct, and the parameters after
    the same steps, equal one process's; close() ends the workers."""
    one, many = _image_pair(threads, parent_computes=parent_computes)
    g = many.threads
    assert g.mode == "processes" and g._workers == []
    ids = list(range(one.hp.n_micro))
    a, b = one.contribute(ids), many.contribute(ids)  # the split rule says split: workers start
    assert np.array_equal(a.grad, b.grad) and g.most_procs == 0 and len(g._workers) == procs
    assert g.wait_ready(240)
    pids = [w.proc.pid for w in g._workers]
    assert all(_alive(p) for p in pids)
    for _ in range(4):
        a, b = one.contribute(ids), many.contribute(ids)
        assert np.array_equal(a.grad, b.grad) and np.array_equal(a.loss, b.loss)
        assert np.array_equal(a.correct, b.correct)
        one.apply(a.grad)
        many.apply(b.grad)
    assert g.most_procs == procs and g.most_used == threads
    assert many.params_sha256() == one.params_sha256() and many.state.step == 4
    part = many.contribute([5, 1, 3])  # any subset of a step's micro-batches, in its order
    want = one.contribute([5, 1, 3])
    assert np.array_equal(part.grad, want.grad) and np.array_equal(part.loss, want.loss)
    g.close()
    assert g._workers == [] and not any(_alive(p) for p in pids)


def test_a_worker_that_dies_gives_one_clear_error():
    """A worker killed under the trainer: the next call raises one line naming the worker
    and its exit, not a hang; the other workers are stopped with it."""
    import os
    import re
    import signal

    from daisychain.engine.procs import ComputeWorkerError

    one, many = _image_pair(3)
    ids = list(range(one.hp.n_micro))
    many.contribute(ids)
    assert many.threads.wait_ready(240)
    many.contribute(ids)
    pids = [w.proc.pid for w in many.threads._workers]
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(ComputeWorkerError) as got:
        many.contribute(ids)
    line = str(got.value)
    assert "\n" not in line
    assert re.fullmatch(rf"compute worker process 2 \(pid {pids[1]}\) (exited with code -9|closed its socket) "
                        r"(during|before) a call; --threads 1 computes in this process alone", line), line
    assert many.threads._workers == [] and not any(_alive(p) for p in pids)


def test_a_killed_parent_leaves_no_worker_behind(tmp_path):
    """The parent killed (SIGKILL: no atexit, no finalizer): its workers see it gone and end."""
    import os
    import signal
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "sys.path.insert(0, %r)\n"
        "from test_threads import _image_pair\n"
        "one, many = _image_pair(3)\n"
        "many.contribute(list(range(6)))\n"
        "assert many.threads.wait_ready(240)\n"
        "print(' '.join(str(w.proc.pid) for w in many.threads._workers), flush=True)\n"
        "time.sleep(600)\n" % os.path.dirname(__file__))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(v) for v in p.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(q) for q in pids)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    end = time.monotonic() + 10
    while any(_alive(q) for q in pids) and time.monotonic() < end:
        time.sleep(0.2)
    assert not any(_alive(q) for q in pids)


def test_train_says_in_one_line_when_its_worker_process_dies():
    """`daisychain train --task image --threads 2`: its worker process (started once the split
    rule says split) killed under it ends the run with one error line, exit 1, no hang."""
    import os
    import re
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-m", "daisychain.cli", "train", "--task", "image", "--steps", "3000",
                          "--threads", "2", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end, kid = time.monotonic() + 240, None
        while kid is None and time.monotonic() < end and p.poll() is None:
            for d in os.listdir("/proc"):
                try:
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().split(")")[-1].split()[1])
                    with open(f"/proc/{d}/cmdline") as f:
                        cmd = f.read()
                except (OSError, ValueError):
                    continue
                if ppid == p.pid and "daisychain.engine.procs" in cmd:
                    kid = int(d)
            time.sleep(0.2)
        assert kid is not None, "no worker process started"
        time.sleep(1.0)
        os.kill(kid, signal.SIGKILL)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 1 and out == "" and "Traceback" not in err
    assert re.fullmatch(rf"daisychain train: error: compute worker process 1 \(pid {kid}\) (exited with code -9|"
                        r"closed its socket) (while starting|during a call|before a call); --threads 1 computes in "
                        r"this process alone", err.strip().splitlines()[-1]), err[-2000:]


def test_a_share_larger_than_the_workers_room_travels_in_the_message():
    """A worker's shared room is sized by the call that started it; a later, larger share is
    sent pickled in the call's message: the same bits either way (a worker given no data set,
    so that the caller sends every share's inputs)."""
    one, many = _image_pair(2, data=None)
    g = many.threads
    small = [0, 1]
    assert np.array_equal(one.contribute(small).grad, many.contribute(small).grad)
    assert g.wait_ready(240) and not g._workers[0].has_data
    room = g._workers[0].x_room[1]
    ids = list(range(one.hp.n_micro))
    x, _ = many.inputs(0, ids)
    assert x[3:].nbytes > room  # the worker's share of 6 micro-batches: 3; its room holds the first call's 2
    for tr_ids in (ids, small, ids):
        a, b = one.contribute(tr_ids), many.contribute(tr_ids)
        assert np.array_equal(a.grad, b.grad) and np.array_equal(a.loss, b.loss)
    assert g.most_procs == 1
    g.close()


def test_a_worker_makes_its_shares_inputs_from_the_indices_it_is_sent(monkeypatch):
    """A worker holds the training set (copied once into its mapping) and makes its share's
    inputs itself, the ±1-pixel shifts included: only a step's micro-batch indices cross to
    it, and every step's contribution, loss and correct equal one process's. Indices that are
    not the run's give one error line, not a hang; a data set over DATA_MAX stays behind (its
    shares' inputs are sent)."""
    from daisychain.engine import procs

    one, many = _image_pair(2)
    g = many.threads
    ids = list(range(one.hp.n_micro))
    many.contribute(ids)
    assert g.wait_ready(240) and g._workers[0].has_data

    def no_inputs_sent(*a, **k):
        raise AssertionError("a share's inputs were sent to a worker that holds the data set")

    monkeypatch.setattr(procs.Worker, "send", no_inputs_sent)
    for step in range(3):
        a, b = one.contribute(ids), many.contribute(ids)
        assert np.array_equal(a.grad, b.grad) and np.array_equal(a.loss, b.loss)
        assert np.array_equal(a.correct, b.correct)
        one.apply(a.grad)
        many.apply(b.grad)
    assert g.most_procs == 1 and many.params_sha256() == one.params_sha256()
    w = g._workers[0]
    for bad in ([one.hp.n_micro], [-1], []):
        w.send_at(many.theta, 0, bad, one.hp.grad_frac_bits, one.limit)
        with pytest.raises(procs.ComputeWorkerError, match=r"failed a call: ValueError: a share of micro-batches "
                                                           r".* is not one of this run's$"):
            w.result(60)
    a, b = one.contribute(ids), many.contribute(ids)  # the worker still serves the run
    assert np.array_equal(a.grad, b.grad)
    g.close()
    monkeypatch.undo()
    monkeypatch.setattr(procs, "DATA_MAX", 0)
    fresh, small = _image_pair(2)
    small.contribute(ids)
    assert small.threads.wait_ready(240) and not small.threads._workers[0].has_data
    assert np.array_equal(small.contribute(ids).grad, fresh.contribute(ids).grad)
    small.threads.close()

"""Do this machine's cores scale, and does the GIL? (issue 33, ``--threads``). Each piece of
work runs alone (1 process, 1 thread), as 2 processes at once, and as 2 threads of one
process, in interleaved rounds; every process has one torch intra-op thread and one BLAS thread.

Work: ``grad`` = one image-task Engine's grad of 2 micro-batches of 16 (what each of
``--threads 2``'s threads computes in a step of 4); ``intmm`` = 10 x two ``torch._int_mm``
(the default CNN's conv shapes); ``numba`` = one nogil im2col kernel call (32 images
28x28x8, k=3).

Two figures per configuration: throughput (calls/s, all workers together; needs the 2 cores
free to mean anything) and work per CPU-second (calls per process CPU second; on a shared,
loaded machine this is what still compares: ~1.0 x one alone means no contention in the
hardware or the process, lower means each call costs more CPU when two run).

Run: ``python -m bench.cores [WORK,...] [SECONDS] [ROUNDS]`` (default grad,intmm,numba 3 3).
Prints; writes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one BLAS thread, before numpy
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

CONFIGS = ((1, 1), (2, 1), (1, 2))  # (processes, threads each)


def _work(name: str):
    """A maker of independent callables (one per thread) of the named work."""
    import torch

    torch.set_num_threads(1)
    if name == "grad":
        import argparse

        from daisychain.engine.model import Engine
        from daisychain.engine.settings import add_run_arguments, settings_from_args
        from daisychain.engine.trainer import Trainer
        from daisychain.units import load_luts

        p = argparse.ArgumentParser()
        add_run_arguments(p)
        rs = settings_from_args(p.parse_args(["--task", "image"]))
        luts = load_luts()
        tr = Trainer(rs.spec, rs.hp, rs.ds, luts, threads=1)
        x, y = tr.inputs(0, np.arange(2))

        def make():
            eng = Engine(rs.spec, luts, "fast")
            return lambda: eng.grad(tr.theta, x, y, tr.hp.grad_frac_bits, tr.limit)
        return make
    rng = np.random.default_rng(0)
    if name == "intmm":
        ops = [(torch.from_numpy(rng.integers(-127, 128, (m, k), dtype=np.int8)),
                torch.from_numpy(rng.integers(-127, 128, (k, n), dtype=np.int8)))
               for m, k, n in ((4096, 72, 16), (1024, 144, 32))]

        def make():
            def f():
                for _ in range(10):
                    for a, b in ops:
                        torch._int_mm(a, b)
            return f
        return make
    if name == "numba":
        from daisychain.engine.convfast import kernels

        k = kernels()
        a = rng.integers(-127, 128, (32 * 28 * 28, 8), dtype=np.int8)

        def make():
            cols = np.empty((32 * 28 * 28, 72), np.int8)
            return lambda: k.im2col(a, 32, 28, 28, 8, 3, cols)
        return make
    raise SystemExit(f"bench.cores: unknown work {name!r} (grad, intmm, numba)")


def _worker(name: str, secs: float, threads: int, go: float) -> None:
    fs = [_work(name)() for _ in range(threads)]
    for f in fs:
        for _ in range(3):
            f()
    while time.time() < go:  # the processes of one configuration start together
        time.sleep(0.01)
    counts = [0] * threads
    stop = time.perf_counter() + secs

    def loop(i):
        while time.perf_counter() < stop:
            fs[i]()
            counts[i] += 1
    c0, t0 = time.process_time(), time.perf_counter()
    ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"rate": sum(counts) / wall, "per_cpu_s": sum(counts) / cpu, "cpu_per_wall": cpu / wall}))


def _launch(name: str, secs: float, procs: int, threads: int):
    go = time.time() + 4.0
    ps = [subprocess.Popen([sys.executable, "-m", "bench.cores", "--worker", name, str(secs), str(threads), str(go)],
                           stdout=subprocess.PIPE) for _ in range(procs)]
    outs = [json.loads(p.communicate()[0].decode().strip().splitlines()[-1]) for p in ps]
    return (sum(o["rate"] for o in outs), sum(o["per_cpu_s"] for o in outs) / procs,
            [round(o["cpu_per_wall"], 2) for o in outs])


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        _worker(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
        return
    works = (sys.argv[1] if len(sys.argv) > 1 else "grad,intmm,numba").split(",")
    secs = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    res: dict = {}
    for r in range(rounds):
        for name in works:
            for procs, threads in CONFIGS:
                rate, eff, cpu = _launch(name, secs, procs, threads)
                res.setdefault((name, procs, threads), []).append((rate, eff))
                print(f"round {r} {name:6s} processes={procs} threads={threads}: {rate:9.1f} calls/s, "
                      f"{eff:8.1f} calls per CPU-second, CPU/wall {cpu}, load {os.getloadavg()[0]:.1f}", flush=True)
    for name in works:
        one = res[(name, 1, 1)]
        for procs, threads in CONFIGS[1:]:
            two = res[(name, procs, threads)]
            what = "2 processes" if procs == 2 else "2 threads"
            print(f"{name}: {what} vs 1 alone, each round: throughput "
                  f"{', '.join(f'{b[0] / a[0]:.2f}x' for a, b in zip(one, two))}; work per CPU-second "
                  f"{', '.join(f'{b[1] / a[1]:.2f}x' for a, b in zip(one, two))}")


if __name__ == "__main__":
    main()

"""A step's micro-batches computed concurrently (``--threads N`` of ``daisychain train``,
``demo``, ``cluster`` and ``daisy-peer``).

The micro-batches given to :meth:`ThreadedGrad.grad` are split into N contiguous runs
(shares), each computed by an Engine of its own (the fast paths keep scratch buffers, so an
Engine is never shared). By default the shares run in worker processes (engine/procs.py):
the calling process computes the first share and N-1 workers the others, each worker a fresh
interpreter with one torch/BLAS thread, sent the spec, unit tables, gemm and the training set
once, then each call's parameters through shared memory and its share's step and micro-batch
indices (the worker makes the inputs; stop 46). Processes, because threads of one
process lose to the GIL: two threads computing the image grad ran 1.6x one, two processes
2.0x (``bench/cores.py``); ``mode="threads"`` keeps the shares on threads of this process
(stop 44's path, measured beside it by ``bench/threads.py``). A contribution is a sum of
exact int64 fixed-point values, so the sum of the shares' sums is the same bits as one
process's, in any order; loss and correct keep the micro-batch order. Every N gives the same
parameters hash (tests/engine/test_threads.py).

A split costs a hand-off and back (~0.1-0.3 ms here), so a step whose micro-batches are
cheap (digits: ~0.1 ms each) ran at 0.55x on 2 threads against 1 (docs/BENCHMARKS.md,
"threads"). A call is split only when each share would take at least :data:`MIN_SHARE_S`
on one thread, by the rate this process measured on its own one-thread calls (the bits
never depend on it). Worker processes are started the first time the rule splits a call,
after :data:`START_AFTER` timed calls (a cheap run never starts one); the caller computes
alone until they are ready, and :meth:`ThreadedGrad.close` (or the interpreter's exit) stops
them.
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

#: The most threads accepted (a typo guard: more threads than cores is allowed, see note_threads).
MAX_THREADS = 256

#: The least one-thread time (seconds) of each thread's share of a call for the call to be
#: split: below it the hand-off costs more than the second core gives (bench/threads.py).
MIN_SHARE_S = 0.002

#: Worker processes start only once this many one-thread calls measured the rate.
START_AFTER = 3


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS says it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def threads_arg(text: str) -> int:
    """argparse ``type`` of ``--threads``: a whole number from 1 to MAX_THREADS, else one line."""
    import argparse

    try:
        n = int(str(text).strip())
    except ValueError:
        n = None
    if n is None or not 1 <= n <= MAX_THREADS:
        raise argparse.ArgumentTypeError(
            f"--threads must be a whole number in [1, {MAX_THREADS}] (default: this machine's "
            f"{cores()} cores), not {text!r}")
    return n


def note_threads(n: int) -> str | None:
    """The log line for more threads than cores (allowed: they share the cores), else None."""
    c = cores()
    if n > c:
        return f"--threads {n} is more than this machine's {c} cores: allowed, the threads share them"
    return None


def threads_for(n: int, threads: int, per_micro_s: float | None, min_share_s: float = MIN_SHARE_S) -> int:
    """How many threads a call of n micro-batches takes: one until a call has measured the
    rate (``per_micro_s``: one thread's seconds a micro-batch, the least seen), then as many
    as keep each share at least ``min_share_s`` (0: all), at most ``threads`` and n. The tab's
    default pool splits by the same rule (webui/shell/worker/trainer_proxy.js workersFor)."""
    k = min(threads, n)
    if k <= 1:
        return 1
    if min_share_s <= 0:
        return k
    if per_micro_s is None:
        return 1
    return max(1, min(k, int(n * per_micro_s // min_share_s)))


class ThreadedGrad:
    """``grad(x, y, theta, frac_bits, limit)`` of n micro-batches on up to ``threads`` processes
    or threads.

    ``make_engine()`` builds one more Engine for a thread (the first is the trainer's own);
    ``procs=(spec, luts, gemm)`` lets a split call run in worker processes (engine/procs.py;
    ``mode`` "processes", the default then; "threads" keeps them in this process).
    ``parent_computes``: this process computes the first share and k-1 workers the others
    (True), or k workers compute all of them. ``min_share_s``: a call is split only when each
    share would take at least this long on one thread (0: always split); ``per_micro_s`` is
    the one-thread seconds a micro-batch took, the least seen (None until a call ran; a split
    call counts its wall time times its shares, an upper bound); ``most_used`` the most
    threads or processes that computed one call, ``most_procs`` the most worker processes."""

    def __init__(self, first, make_engine: Callable, threads: int, min_share_s: float = MIN_SHARE_S,
                 procs: tuple | None = None, mode: str | None = None, parent_computes: bool = True,
                 data: tuple | None = None):
        self.threads = int(threads)
        self.min_share_s = float(min_share_s)
        self.per_micro_s: float | None = None
        self.most_used = 0
        self.most_procs = 0
        self.mode = mode or ("processes" if procs is not None else "threads")
        if self.mode not in ("processes", "threads") or (self.mode == "processes" and procs is None):
            raise ValueError(f"ThreadedGrad mode {self.mode!r}: 'threads', or 'processes' with procs=")
        self.parent_computes = bool(parent_computes)
        #: (x_train, y_train, image_shape, hp): the data set a worker process holds to make its
        #: shares' inputs (grad_of's ``at``); None: every share's inputs are sent
        self.data = data
        self._engines = [first]
        self._make = make_engine
        self._procs = procs
        self._workers: list = []  # engine/procs.py Worker, started when a call is first split
        self._pool = None
        self._finalizer = None
        self._timed = 0  # one-thread calls timed

    def split(self, n: int) -> int:
        """How many threads a call of n micro-batches takes (:func:`threads_for`)."""
        return threads_for(n, self.threads, self.per_micro_s, self.min_share_s)

    def grad(self, x: np.ndarray, y: np.ndarray, theta: np.ndarray, frac_bits: int, limit: float):
        """The Result of micro-batches (x, y) (n of them: ``len(y)``)."""
        return self.grad_of(len(y), lambda a, b: (x[a:b], y[a:b]), theta, frac_bits, limit)

    def grad_of(self, n: int, inputs: Callable, theta: np.ndarray, frac_bits: int, limit: float,
                at: tuple | None = None):
        """:meth:`grad` of n micro-batches whose (x, y) of micro-batches [a, b) are
        ``inputs(a, b)``, made only for the shares this process computes or hands out.
        ``at`` = (step, micro_ids): a worker process that holds the data set (``data=``)
        makes its share's inputs itself from these (the same ``step_inputs``, so the same
        bits), so only the indices cross to it."""
        k = self.split(n)
        # the image path's torch._int_mm: one intra-op thread in every process, so that N
        # shares use N cores, not N x cores, and --threads 1 is one core (torch's default pool,
        # a thread a core, ran 1.35x and 8.4x slower here at load 10-11: bench/torch_threads.py)
        torch = sys.modules.get("torch")
        if torch is not None and torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        if k > 1 and self.mode == "processes":
            # a worker process costs a start (seconds of CPU): only once the rate is the
            # least of START_AFTER calls (a first, cold call can make cheap ones look dear)
            k = 1 if self.min_share_s > 0 and self._timed < START_AFTER and not self._workers \
                else self._ready_workers(k, theta, inputs, n, frac_bits, limit)
        self.most_used = max(self.most_used, k)
        if k <= 1:
            t0 = time.perf_counter()
            x, y = inputs(0, n)
            got = self._engines[0].grad(theta, x, y, frac_bits, limit)
            if n:
                self._seen((time.perf_counter() - t0) / n)
                self._timed += 1
            return got
        cuts = [(w * n) // k for w in range(k + 1)]
        t0 = time.perf_counter()
        if self.mode == "processes":
            parts = self._grad_procs(inputs, at, theta, frac_bits, limit, cuts)
        else:
            x, y = inputs(0, n)
            parts = self._grad_threads(x, y, theta, frac_bits, limit, cuts)
        # k shares' wall time bounds one thread's time from above: a first, slow one-thread
        # call (compiles, caches) that made the split look worth it is corrected this way
        self._seen((time.perf_counter() - t0) * k / n)
        return parts

    def _grad_threads(self, x, y, theta, frac_bits, limit, cuts):
        from daisychain.engine.model import Result

        k = len(cuts) - 1
        while len(self._engines) < k:
            self._engines.append(self._make())
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="daisy-compute")
        futures = [self._pool.submit(self._engines[w].grad, theta, x[cuts[w]:cuts[w + 1]],
                                     y[cuts[w]:cuts[w + 1]], frac_bits, limit) for w in range(k)]
        parts = [f.result() for f in futures]
        grad = parts[0].grad.copy()
        for p in parts[1:]:
            grad += p.grad
        return Result(grad, np.concatenate([p.loss for p in parts]), np.concatenate([p.correct for p in parts]))

    def _ready_workers(self, k, theta, inputs, n, frac_bits, limit) -> int:
        """The shares a split call takes now: k once the workers it needs are ready (they are
        started here, the first time, with a warm-up share of this call; until they answer,
        1: this process alone)."""
        from daisychain.engine import procs

        need = k - 1 if self.parent_computes else k
        if len(self._workers) < need:
            if self._finalizer is None:
                self._finalizer = weakref.finalize(self, procs.stop_all, self._workers)
            share = -(-n // k)
            spec, luts, gemm = self._procs
            x, y = inputs(0, n)
            while len(self._workers) < need:
                self._workers.append(procs.Worker(len(self._workers) + 1, spec, luts, gemm, theta, x[:share],
                                                  y[:share], frac_bits, limit, room=(x.nbytes, y.nbytes),
                                                  data=self.data))
        try:
            ready = 0
            for w in self._workers[:need]:
                if not w.ready():
                    break
                ready += 1
        except procs.ComputeWorkerError:
            self.close()
            raise
        if self.parent_computes:
            return ready + 1
        return ready if ready >= 2 else 1

    def _grad_procs(self, inputs, at, theta, frac_bits, limit, cuts):
        from daisychain.engine import procs
        from daisychain.engine.model import Result

        k = len(cuts) - 1
        first = 1 if self.parent_computes else 0
        ws = self._workers[:k - first]
        self.most_procs = max(self.most_procs, len(ws))
        per = self.per_micro_s or 1.0
        timeout = max(procs.MIN_TIMEOUT_S, 100.0 * per * (cuts[1] - cuts[0] + 1))
        try:
            for i, w in enumerate(ws):  # the workers first: they start while this process makes its inputs
                a, b = cuts[first + i], cuts[first + i + 1]
                if at is not None and w.has_data:
                    w.send_at(theta, at[0], at[1][a:b], frac_bits, limit)
                else:
                    w.send(theta, *inputs(a, b), frac_bits, limit)
            if first:
                own = self._engines[0].grad(theta, *inputs(0, cuts[1]), frac_bits, limit)
                grad, losses, corrects = own.grad.copy(), [own.loss], [own.correct]
            else:
                grad, losses, corrects = np.zeros(len(theta), np.int64), [], []
            for w in ws:
                loss, correct = w.result(timeout)
                grad += w.grad
                losses.append(loss)
                corrects.append(correct)
        except BaseException:  # a worker failed, or this process's share (an interrupt): the
            self.close()  # workers' answers are not read, so a later call starts fresh ones
            raise
        return Result(grad, np.concatenate(losses), np.concatenate(corrects))

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Wait until every started worker process is ready (tests and benches: a run that is
        not told waits for nothing, it computes on its own meanwhile)."""
        return all(w.wait_ready(timeout) for w in self._workers)

    def _seen(self, per_micro: float) -> None:
        self.per_micro_s = per_micro if self.per_micro_s is None else min(self.per_micro_s, per_micro)

    def close(self) -> None:
        """Stop the worker processes and the thread pool (a later split call starts new ones)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        if self._finalizer is not None:
            self._finalizer()  # stop_all(self._workers): the list is emptied
            self._finalizer = None


def add_threads_argument(p) -> None:
    """``--threads N`` on a command's parser (train, demo, cluster, daisy-peer)."""
    p.add_argument("--threads", type=threads_arg, default=None, metavar="N",
                   help=f"compute a step's micro-batches on N cores (this process and N-1 worker "
                        f"processes), same bits for every N "
                        f"(default: this machine's cores, {cores()} here)")


def threads_from(args, prog: str) -> int:
    """The thread count of parsed ``args`` (default: the cores), saying on stderr when it is
    more than the cores."""
    import sys

    n = args.threads if getattr(args, "threads", None) else cores()
    note = note_threads(n)
    if note:
        print(f"{prog}: {note}", file=sys.stderr)
    return n

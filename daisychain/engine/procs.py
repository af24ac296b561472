"""Worker processes that compute shares of a split call of ``ThreadedGrad`` (engine/threads.py).

Two processes each computing the image grad run 2.0x one on this 2-core machine, two threads
of one process 1.6x: the numpy glue and torch's per-call dispatch hold the GIL
(docs/BENCHMARKS.md, ``bench/cores.py``). So ``--threads N`` computes a split call's shares
in worker processes, each with an Engine of its own, built from what the parent sends.

A worker is a fresh interpreter (``python -c`` that runs :func:`main` of this module, started by
``subprocess``: no fork after torch or OpenMP started in the parent), with one torch, BLAS and
OpenMP thread, SIGINT ignored (it follows its parent). The parent and it share:

- one unnamed file in /dev/shm (unlinked at once, its descriptor passed to the child, so
  nothing is left behind however either side ends) holding a header of offsets, the
  parameters (float64, written by the parent before each call), the contribution (int64,
  written by the worker), room for a share's x and y (a share larger than the room travels
  pickled in the call's message), the start-up blob (spec, unit tables, gemm, and one
  warm-up call's inputs) and, given one of at most :data:`DATA_MAX` bytes, the training set
  (x and y, with the image shape and the hyper-parameters in the blob);
- a socket pair carrying small pickled messages: ``("grad", ...)`` (a share's inputs in the
  mapping) or ``("grad_at", step, micro_ids, ...)`` (a worker that holds the training set
  makes the share's inputs itself with the trainer's ``step_inputs``: the same bits; indices
  that are not a step's micro-batches answer an error) -> ``("done", loss, correct)`` or
  ``("error", line)``; ``("stop",)``.

The worker builds its Engine, runs the warm-up call (numba caches, scratch arrays) and says
``("ready", pid)``; the parent keeps computing on its own until then (:meth:`Worker.ready`
polls, it never waits). A worker ends on ``stop``, when its socket closes, or when its parent
is gone (it looks every second), so a killed parent leaves no orphan; the parent stops its
workers on ``close()`` and at exit. A worker that dies or does not answer within
``timeout_s`` raises :class:`ComputeWorkerError`, one line, instead of a hang.
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

#: bytes: 16 int64 offsets/sizes (theta, grad, x, x room, y, y room, blob, blob length, the data
#: set's x and its bytes, its y and its bytes; 0 bytes: not held)
_HEADER = 128
_SLOTS = 16
_ALIGN = 64
#: The largest data set (x and y bytes) a worker is given to make its shares' inputs itself;
#: a larger one stays in the parent, which sends each share's inputs.
DATA_MAX = 1 << 28
#: The least seconds a call waits for a worker that is alive before it is called hung.
MIN_TIMEOUT_S = 60.0


class ComputeWorkerError(RuntimeError):
    """A compute worker process died, failed or hung: one line that says which and how."""


def _up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _child_env() -> dict:
    env = dict(os.environ)
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[v] = "1"  # one compute thread per process: N processes use N cores
    return env


#: The child's program: this very daisychain (the folder that holds it first on the path, ahead
#: of the working directory, which may hold another checkout), then :func:`main`.
_CHILD = ("import sys; sys.path.insert(0, {root!r}); from daisychain.engine.procs import main; main()"
          .format(root=str(Path(__file__).resolve().parents[2])))


class Worker:
    """The parent's side of one compute worker process (started at construction)."""

    def __init__(self, index: int, spec, luts, gemm: str, theta: np.ndarray, x: np.ndarray, y: np.ndarray,
                 frac_bits: int, limit: float, room: tuple[int, int] = (0, 0), data: tuple | None = None):
        """Start worker ``index`` for (spec, luts, gemm), its warm-up call (theta, x, y), with
        room for a share of ``room`` = (x bytes, y bytes) (at least the warm-up's). ``data`` =
        (x_train, y_train, image_shape, hp): the data set, copied into the mapping once (at most
        :data:`DATA_MAX` bytes), so that :meth:`send_at` sends a share's indices only."""
        self.index = index
        self.ready_ = False
        if data is not None and data[0].nbytes + data[1].nbytes > DATA_MAX:
            data = None
        self.has_data = data is not None
        dx, dy = (np.ascontiguousarray(data[0]), np.ascontiguousarray(data[1])) if data is not None else (None, None)
        blob = pickle.dumps({"spec": spec, "luts": luts, "gemm": gemm, "frac_bits": frac_bits, "limit": limit,
                             "x": (x.shape, x.dtype.str), "y": (y.shape, y.dtype.str),
                             "data": None if data is None else ((dx.shape, dx.dtype.str), (dy.shape, dy.dtype.str),
                                                                data[2], data[3])}, pickle.HIGHEST_PROTOCOL)
        p = theta.size * 8
        off = [_HEADER, _HEADER + _up(p), _HEADER + 2 * _up(p), _up(max(x.nbytes, room[0]))]
        off += [off[2] + off[3], _up(max(y.nbytes, room[1]))]
        off += [off[4] + off[5], len(blob)]
        off += [off[6] + _up(len(blob)), 0 if dx is None else dx.nbytes]
        off += [off[8] + _up(off[9]), 0 if dy is None else dy.nbytes]
        off += [0] * (_SLOTS - len(off))
        size = off[10] + _up(off[11])
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self._file = tempfile.TemporaryFile(dir=shm)  # unlinked: gone when both sides close it
        self._file.truncate(size)
        self.mm = mmap.mmap(self._file.fileno(), size)
        np.frombuffer(self.mm, np.int64, _SLOTS, 0)[:] = off
        self.theta = np.frombuffer(self.mm, np.float64, theta.size, off[0])
        self.grad = np.frombuffer(self.mm, np.int64, theta.size, off[1])
        self.x_room, self.y_room = (off[2], off[3]), (off[4], off[5])
        self.mm[off[6]:off[6] + len(blob)] = blob
        if dx is not None:
            np.ndarray(dx.shape, dx.dtype, buffer=self.mm, offset=off[8])[...] = dx
            np.ndarray(dy.shape, dy.dtype, buffer=self.mm, offset=off[10])[...] = dy
        self.theta[:] = theta
        self._put(x, self.x_room)
        self._put(y, self.y_room)
        mine, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(theirs.fileno()), str(self._file.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(), self._file.fileno()), env=_child_env(),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        finally:
            theirs.close()  # the child's end lives in the child only: its death closes the socket
        self.conn = Connection(mine.detach())

    def _put(self, a: np.ndarray, room: tuple[int, int]) -> bool:
        if a.nbytes > room[1]:
            return False
        np.ndarray(a.shape, a.dtype, buffer=self.mm, offset=room[0])[...] = a
        return True

    def _died(self, during: str) -> ComputeWorkerError:
        rc = self.proc.poll()
        how = f"exited with code {rc}" if rc is not None else "closed its socket"
        return ComputeWorkerError(f"compute worker process {self.index} (pid {self.proc.pid}) {how} {during}; "
                                  f"--threads 1 computes in this process alone")

    def ready(self) -> bool:
        """True once the worker has built its Engine and run its warm-up call (never waits);
        raises ComputeWorkerError if it failed or died starting."""
        if self.ready_:
            return True
        try:
            if not self.conn.poll(0):
                if self.proc.poll() is not None:
                    raise self._died("while starting")
                return False
            msg = self.conn.recv()
        except (EOFError, OSError):
            raise self._died("while starting") from None
        if msg[0] != "ready":
            raise ComputeWorkerError(f"compute worker process {self.index} (pid {self.proc.pid}) failed starting: "
                                     f"{msg[1]}")
        self.ready_ = True
        return True

    def wait_ready(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > end:
                return False
            self.conn.poll(min(0.2, max(0.0, end - time.monotonic())))
        return True

    def send(self, theta: np.ndarray, x: np.ndarray, y: np.ndarray, frac_bits: int, limit: float) -> None:
        """Start computing the share (x, y) on theta; :meth:`result` collects it."""
        self.theta[:] = theta
        xin = None if self._put(x, self.x_room) else x
        yin = None if self._put(y, self.y_room) else y
        try:
            self.conn.send(("grad", x.shape, x.dtype.str, y.shape, y.dtype.str, xin, yin, frac_bits, limit))
        except OSError:
            raise self._died("before a call") from None

    def send_at(self, theta: np.ndarray, step: int, micro_ids, frac_bits: int, limit: float) -> None:
        """Start computing micro-batches ``micro_ids`` of ``step``, their inputs made by the worker
        from the data set it holds (``data=``); :meth:`result` collects it."""
        self.theta[:] = theta
        try:
            self.conn.send(("grad_at", int(step), [int(i) for i in micro_ids], frac_bits, limit))
        except OSError:
            raise self._died("before a call") from None

    def result(self, timeout_s: float):
        """(loss, correct) of the call sent; its contribution is in ``self.grad`` until the next."""
        end = time.monotonic() + timeout_s
        try:
            while not self.conn.poll(0.5):
                if self.proc.poll() is not None:
                    raise self._died("during a call")
                if time.monotonic() > end:
                    raise ComputeWorkerError(
                        f"compute worker process {self.index} (pid {self.proc.pid}) gave no answer in "
                        f"{timeout_s:.0f} s; --threads 1 computes in this process alone")
            msg = self.conn.recv()
        except (EOFError, OSError):
            raise self._died("during a call") from None
        if msg[0] != "done":
            raise ComputeWorkerError(f"compute worker process {self.index} (pid {self.proc.pid}) failed a call: "
                                     f"{msg[1]}")
        return msg[1], msg[2]

    def stop(self) -> None:
        """Ask the worker to end, and make sure it did (killed after a second)."""
        try:
            self.conn.send(("stop",))
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(1.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()
        self.theta = self.grad = None  # the mapping's views, then the mapping and its file
        try:
            self.mm.close()
        except BufferError:  # a view still held elsewhere: the memory goes with it
            pass
        self._file.close()


def stop_all(workers: list) -> None:
    """Stop every worker of the list (a finalizer: holds no reference to its owner)."""
    while workers:
        workers.pop().stop()


# ------------------------------------------------------------------------- the child side
def _view(mm, offs, i, shape, dtype):
    return np.ndarray(shape, np.dtype(dtype), buffer=mm, offset=int(offs[i]))


def _data_inputs(init, mm, offs):
    """``inputs(step, micro_ids)`` of the data set the parent put in the mapping (None if none):
    the trainer's own ``step_inputs`` on the same arrays, hyper-parameters and schedule."""
    if init.get("data") is None:
        return None
    import types

    from daisychain.engine.augment import step_inputs
    from daisychain.engine.schedule import Schedule

    (xs, xd), (ys, yd), image_shape, hp = init["data"]
    ds = types.SimpleNamespace(x_train=_view(mm, offs, 8, xs, xd), y_train=_view(mm, offs, 10, ys, yd),
                               image_shape=image_shape)
    schedule = Schedule(len(ds.y_train), hp)

    def inputs(step, ids):
        if not (isinstance(step, int) and step >= 0 and isinstance(ids, list) and 0 < len(ids) <= hp.n_micro
                and all(isinstance(i, int) and 0 <= i < hp.n_micro for i in ids)):
            raise ValueError(f"a share of micro-batches {ids!r} of step {step!r} is not one of this run's")
        return step_inputs(ds, hp, schedule, step, ids)

    return inputs


def _serve(conn: Connection, mm, parent: int) -> None:
    offs = np.frombuffer(mm, np.int64, _SLOTS, 0).copy()
    init = pickle.loads(mm[int(offs[6]):int(offs[6] + offs[7])])
    from daisychain.engine.model import Engine

    engine = Engine(init["spec"], init["luts"], init["gemm"])
    size = engine.layout.size
    theta = np.ndarray((size,), np.float64, buffer=mm, offset=int(offs[0]))
    grad = np.ndarray((size,), np.int64, buffer=mm, offset=int(offs[1]))
    (xs, xd), (ys, yd) = init["x"], init["y"]
    engine.grad(theta, _view(mm, offs, 2, xs, xd), _view(mm, offs, 4, ys, yd), init["frac_bits"], init["limit"])
    inputs = _data_inputs(init, mm, offs)
    conn.send(("ready", os.getpid()))
    while True:
        while not conn.poll(1.0):
            if os.getppid() != parent:  # the parent is gone (killed): no orphan
                return
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] not in ("grad", "grad_at"):
            return
        try:
            if msg[0] == "grad_at":
                if inputs is None:
                    raise ValueError("this worker holds no data set")
                _, step, ids, frac_bits, limit = msg
                x, y = inputs(step, ids)
            else:
                _, xs, xd, ys, yd, x, y, frac_bits, limit = msg
                x = _view(mm, offs, 2, xs, xd) if x is None else x
                y = _view(mm, offs, 4, ys, yd) if y is None else y
            got = engine.grad(theta, x, y, frac_bits, limit)
            grad[:] = got.grad
            conn.send(("done", np.asarray(got.loss).copy(), np.asarray(got.correct).copy()))
        except Exception as exc:  # noqa: BLE001 (the parent raises it as one line)
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C ends the parent; the worker follows it
    conn = Connection(int(sys.argv[1]))
    mm = mmap.mmap(int(sys.argv[2]), 0)
    try:
        _serve(conn, mm, int(sys.argv[3]))
    except Exception as exc:  # noqa: BLE001 (start-up: the parent raises it as one line)
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass


if __name__ == "__main__":
    main()

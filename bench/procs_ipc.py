"""How a split call's data travels to a worker process (engine/procs.py, issue 33): the image
task's parameters (29,066 float64), a share's x (2 x 16 x 784 uint8) and y out, its int64
contribution back, as pickled arrays through the socket (``pipe``) or written into a shared
/dev/shm mapping with only a small message on the socket (``shm``, what procs.py does). The
child computes nothing: this is the hand-off's round trip alone, interleaved rounds.

Run: ``python -m bench.procs_ipc``. Prints; writes nothing.
"""
import mmap
import os
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection

import numpy as np

P = 29066  #: the default image CNN's parameters
ROUNDS, CALLS = 5, 500


def _child() -> None:
    conn, mm = Connection(int(sys.argv[2])), mmap.mmap(int(sys.argv[3]), 0)
    grad = np.ndarray((P,), np.int64, buffer=mm, offset=P * 8)
    out = np.ones(P, np.int64)
    while (msg := conn.recv()) is not None:
        if msg[0] == "pipe":
            conn.send(("done", out, np.zeros(2), np.zeros(2, np.int64)))
        else:
            grad[:] = out
            conn.send(("done", np.zeros(2), np.zeros(2, np.int64)))


def main() -> None:
    if sys.argv[1:2] == ["child"]:
        return _child()
    f = tempfile.TemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    f.truncate(P * 16 + 60000)
    mm = mmap.mmap(f.fileno(), P * 16 + 60000)
    mine, theirs = socket.socketpair()
    child = subprocess.Popen([sys.executable, "-m", "bench.procs_ipc", "child", str(theirs.fileno()),
                              str(f.fileno())], pass_fds=(theirs.fileno(), f.fileno()))
    theirs.close()
    conn = Connection(mine.detach())
    theta, x, y = np.random.rand(P), np.zeros((2, 16, 784), np.uint8), np.zeros((2, 16), np.int32)
    th = np.ndarray((P,), np.float64, buffer=mm, offset=0)
    grad = np.ndarray((P,), np.int64, buffer=mm, offset=P * 8)
    xr = np.ndarray(x.shape, x.dtype, buffer=mm, offset=P * 16)
    res: dict[str, list[float]] = {"pipe": [], "shm": []}
    for _ in range(ROUNDS):
        for way in ("pipe", "shm"):
            t = time.perf_counter()
            for _ in range(CALLS):
                if way == "pipe":
                    conn.send(("pipe", theta, x, y))
                    total = conn.recv()[1] + 0
                else:
                    th[:] = theta
                    xr[...] = x
                    conn.send(("shm", x.shape))
                    conn.recv()
                    total = grad + 0
            res[way].append((time.perf_counter() - t) / CALLS * 1e6)
    conn.send(None)
    child.wait()
    assert total.sum() == P
    print(", ".join(f"{k}: {min(v):.0f} us a round trip" for k, v in res.items()),
          f"(best of {ROUNDS} interleaved rounds of {CALLS}; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()

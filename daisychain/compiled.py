"""The one way DaisyChain compiles a loop: :func:`numba_jit`, used by the engine's passes
(engine/fast.py), its fused Adam (engine/adam.py) and the wire's varint loops
(peer/intcodec.py). Every caller keeps a numpy path that gives the same bits."""

from __future__ import annotations

import os
import threading

_numba = None  # the module once imported; False when it cannot be


def numba_jit():
    """``numba.njit`` for exact arithmetic: cached on disk, no fastmath (no fused
    multiply-add, no reordering), the GIL released, no bounds checks, numpy's error model.
    None without numba (tried once per process) or while DAISYCHAIN_NO_NUMBA is set: the
    caller takes its numpy path."""
    global _numba
    if os.environ.get("DAISYCHAIN_NO_NUMBA"):
        return None
    if _numba is None:
        try:
            import numba
        except ImportError:  # numba is a dependency; the numpy paths give the same bits
            numba = False
        _numba = numba
    if not _numba:
        return None
    return _numba.njit(cache=True, fastmath=False, nogil=True, boundscheck=False,
                       error_model="numpy")


def built_once(build):
    """A function that calls ``build`` the first time (one thread builds, the others wait) and
    returns its result ever after: a module's compiled loops, made on first use (``build``
    returns None without numba, and that is kept too)."""
    box: list = []
    lock = threading.Lock()

    def get():
        if not box:
            with lock:
                if not box:
                    box.append(build())
        return box[0]
    return get

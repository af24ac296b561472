"""Which samples make up each micro-batch of each step (engine/trainer.py re-exports it): its
own module so that a worker process (engine/procs.py) can make a share's inputs without the
trainer's imports."""

from __future__ import annotations

import numpy as np

from daisychain.engine import prng
from daisychain.engine.spec import Hyper


class Schedule:
    """Which samples make up micro-batch j of step t: the step's global batch is positions
    [t*B, (t+1)*B) of the endless sample stream formed by concatenating one permutation of
    the training set per epoch (``prng.permutation(seed, STREAM_SHUFFLE + epoch, N)``)."""

    def __init__(self, n_train: int, hp: Hyper):
        self.n = n_train
        self.hp = hp
        self._perms: dict[int, np.ndarray] = {}
        self._step_cache: tuple[int, np.ndarray] | None = None

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = prng.permutation(self.hp.seed, prng.STREAM_SHUFFLE + epoch, self.n)
        return self._perms[epoch]

    def samples(self, step: int, micro: int) -> np.ndarray:
        return self.step_samples(step)[micro]

    def step_samples(self, step: int) -> np.ndarray:
        """Sample indices of every micro-batch of a step: (n_micro, micro_batch)."""
        hit = self._step_cache
        if hit is not None and hit[0] == step:
            return hit[1]
        pos = step * self.hp.batch + np.arange(self.hp.batch)
        first, last = pos[0] // self.n, pos[-1] // self.n
        if first == last:
            out = self._perm(int(first))[pos - first * self.n]
        else:
            out = np.empty(self.hp.batch, np.int64)
            for epoch in range(int(first), int(last) + 1):
                sel = pos // self.n == epoch
                out[sel] = self._perm(epoch)[pos[sel] % self.n]
        out = out.reshape(self.hp.n_micro, self.hp.micro_batch)
        self._step_cache = (step, out)
        return out

"""How a step's contributions become its total. :class:`Star`: every contribution comes to
the coordinator, which sums them (each micro-batch exactly once; a spot-checked one from its
reference answer) and sends the total to everyone. Another topology (a ring) plugs in here
with the same ``total`` answer."""

from __future__ import annotations

import numpy as np


class Star:
    def total(self, tasks, checks, size: int, me: str):
        """``tasks``: the step's tasks (their ``kind == "main"`` results count), ``checks``:
        micro-batch -> its decided check. Returns (int64 total, contributors as sorted
        (peer, micro-batches), mean loss over micro-batches, the peers other than ``me``
        whose contribution in the total no spot-check confirmed)."""
        total = np.zeros(size, np.int64)
        per: dict[str, int] = {}
        unchecked: set[str] = set()
        loss_sum, n = 0.0, 0
        for t in sorted((t for t in tasks if t.kind == "main"), key=lambda t: t.task):
            peer, ints, loss, _ = t.result
            c = checks.get(t.micro[0]) if len(t.micro) == 1 else None
            if c is not None:  # a spot-checked micro-batch: the reference answer counts
                ref, loss, _ = c.decided
                if not np.array_equal(ints, ref):
                    peer, ints = c.decided_by, ref
                if len(c.votes) < 2 and peer != me:  # one answer, nobody confirmed it
                    unchecked.add(peer)
            elif peer != me:
                unchecked.add(peer)
            total += ints
            per[peer] = per.get(peer, 0) + len(t.micro)
            loss_sum += loss
            n += len(t.micro)
        return total, tuple(sorted(per.items())), loss_sum / max(n, 1), unchecked

"""Spot-checks as pure functions: which micro-batches of a step are checked, and the verdict
over the answers a check got."""

from __future__ import annotations

import hashlib
import math

def checked_micro(key: str, step: int, n_micro: int, rate: float) -> list[int]:
    """The micro-batches of ``step`` that are spot-checked: micro-batch j is when the first
    8 bytes of SHA-256(``key:step:j``), as a big-endian u64, are below ``floor(rate * 2**64)``.
    ``key`` is the coordinator's secret, so no member can tell in advance."""
    bound = math.floor(rate * 2.0**64)
    out = []
    for j in range(n_micro):
        h = hashlib.sha256(f"{key}:{step}:{j}".encode()).digest()
        if int.from_bytes(h[:8], "big") < bound:
            out.append(j)
    return out



def verdict(votes: dict, me: str, still_open: bool, refereed: bool) -> tuple[str, object]:
    """The decision on a spot-checked micro-batch from its answers so far (``votes``: peer ->
    int64 contribution, in the order they came): ``("decide", peer)`` (that peer's answer
    is the reference), ``("wait", None)`` or ``("referee", peers)`` (they differ and no
    answer can be trusted over another: the coordinator computes it itself). All equal:
    decided once two or more agree, or one when nobody else can still answer
    (``still_open`` false). Different: the coordinator's own answer is the reference (it
    referees), never two peers that agree: two liars that lie alike outvoted an honest peer
    and had it struck (bench.simulate seed 1264)."""
    values: dict[bytes, list[str]] = {}
    for peer, ints in votes.items():
        values.setdefault(ints.tobytes(), []).append(peer)
    if len(values) == 1:
        if len(votes) >= 2 or not still_open:
            return "decide", next(iter(votes))
        return "wait", None
    if me in votes:
        return "decide", me
    if refereed:
        return "wait", None
    return "referee", sorted(votes)

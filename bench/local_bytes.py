"""What local steps cost on the wire: the entries and the encoded bytes (peer/intcodec.py,
the smaller of NARROW and VARINT per tensor segment, as a room sends them) of one
contribution and one total, synchronous vs ``--replicas R --sync-every H``, after a few
steps/rounds of the same run, and per training sample. Prints a markdown table.

Local steps (engine/local.py): an anchor round (every K-th) carries every replica's moments,
as every round did before anchors (the "K=1" row); a round between anchors carries the
deltas only; the "mean" row is one anchor and K - 1 rounds between, per round.

    python -m bench.local_bytes --task text --replicas 4 --sync-every 8 --rounds 3
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from daisychain.engine.local import make_trainer
from daisychain.engine.settings import add_run_arguments, settings_from_args
from daisychain.peer.intcodec import Codec, encode_ints
from daisychain.peer.run.state import tensor_bounds
from daisychain.units import load_luts

ZIPPED = (Codec.NARROW, Codec.VARINT, Codec.NARROW_Z, Codec.VARINT_Z)


def sizes(rs, hp, rounds: int, k: int = 1) -> dict:
    """Bytes of round ``rounds`` (its moments ride along when K = k makes it an anchor)."""
    tr = make_trainer(rs.spec, hp, rs.ds, load_luts())
    if hp.local:
        tr.moments_every = k
    bounds = tensor_bounds(tr)
    for _ in range(rounds):
        tr.apply(tr.contribute(range(tr.n_tasks)).grad)
    one = tr.contribute([0]).grad
    total = tr.contribute(range(tr.n_tasks)).grad
    per = hp.batch * (hp.replicas * hp.sync_every if hp.local else 1)  # samples a total stands for
    return {"params": tr.layout.size, "entries": tr.total_size,
            "task": len(encode_ints(one, bounds)[1]), "total": len(encode_ints(total, bounds)[1]),
            "total_z": len(encode_ints(total, bounds, ZIPPED)[1]), "samples": per}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_run_arguments(p)
    p.add_argument("--rounds", type=int, default=3, help="rounds before the one measured (not "
                   "an anchor at K: rounds + 1 not a multiple of K)")
    args = p.parse_args(argv)
    rs = settings_from_args(args)
    k = rs.hp.moments_every
    if (args.rounds + 1) % k == 0:
        p.error(f"round {args.rounds} is an anchor at K = {k}: pick another --rounds")
    name = f"R={rs.hp.replicas} H={rs.hp.sync_every}"
    sync = sizes(rs, dataclasses.replace(rs.hp, replicas=1, sync_every=1),
                 args.rounds * rs.hp.replicas * rs.hp.sync_every)
    every = sizes(rs, rs.hp, args.rounds)
    between = sizes(rs, rs.hp, args.rounds, k)
    mean = {key: (every[key] + (k - 1) * between[key]) / k if key in ("task", "total", "total_z")
            else between[key] for key in every}
    print(f"task {rs.ds.task}, batch {rs.hp.batch}, after {args.rounds} rounds (the same samples)\n")
    print("| run | P | entries | one task, bytes | total, bytes | total zipped | samples per total | "
          "total bytes per sample |\n|---|---|---|---|---|---|---|---|")
    for row, s in (("synchronous", sync), (f"{name}, every round (K=1: an anchor each round)", every),
                   (f"{name}, a round between anchors", between), (f"{name}, K={k}: mean of K rounds", mean)):
        print(f"| {row} | {s['params']} | {s['entries']} | {s['task']:,.0f} | {s['total']:,.0f} | "
              f"{s['total_z']:,.0f} | {s['samples']} | {s['total'] / s['samples']:.1f} |")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()

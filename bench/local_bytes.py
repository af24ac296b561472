"""What local steps cost on the wire: the entries and the encoded bytes (peer/intcodec.py,
the smaller of NARROW and VARINT per tensor segment, as a room sends them) of one
contribution and one total, synchronous vs ``--replicas R --sync-every H``, after a few
steps/rounds of the same run, and per training sample. Prints a markdown table.

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


def sizes(rs, hp, rounds: int) -> dict:
    tr = make_trainer(rs.spec, hp, rs.ds, load_luts())
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
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    rs = settings_from_args(args)
    rows = [("synchronous", dataclasses.replace(rs.hp, replicas=1, sync_every=1), args.rounds
             * rs.hp.replicas * rs.hp.sync_every), (f"R={rs.hp.replicas} H={rs.hp.sync_every}", rs.hp, args.rounds)]
    print(f"task {rs.ds.task}, batch {rs.hp.batch}, after {args.rounds} rounds (the same samples)\n")
    print("| run | P | entries | one task, bytes | total, bytes | total zipped | samples per total | "
          "total bytes per sample |\n|---|---|---|---|---|---|---|---|")
    for name, hp, n in rows:
        s = sizes(rs, hp, n)
        print(f"| {name} | {s['params']} | {s['entries']} | {s['task']} | {s['total']} | {s['total_z']} | "
              f"{s['samples']} | {s['total'] / s['samples']:.1f} |")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()

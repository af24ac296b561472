"""What anchors save in a real room: ``daisychain demo`` (real daisy-peer nodes, aiortc data
channels on loopback, in-process) of one local-steps run at several K (engine/local.py
``--moments-every K``: the bits do not depend on it), printing the host's
bytes sent and received, its committed rounds per second, the replica rounds it replayed
and the hash. Run it in the private network namespace:

    ./scripts/in-netns.sh .venv/bin/python -m bench.local_anchor_room --task text --data FILE \\
        --replicas 2 --sync-every 8 --steps 24 --ks 1 8 16
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ks = [1, 8]
    if "--ks" in argv:
        at = argv.index("--ks")
        rest = argv[at + 1:]
        n = next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))
        ks, argv = [int(k) for k in rest[:n]], argv[:at] + rest[n:]
    from daisychain.cli import main as cli

    print(f"daisychain demo --peers 2 {' '.join(argv)}\n")
    print("| K | host rounds/s | host bytes sent | host bytes received | host replica rounds replayed | hash |")
    print("|---|---|---|---|---|---|")
    for k in ks:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            cli(["demo", "--peers", "2", "--port", "0", "--json", *argv, "--moments-every", str(k)])
        out = json.loads(buf.getvalue().strip().splitlines()[-1])
        rate = out.get("steps_per_s")
        print(f"| {k} | {rate:.2f} | {out['bytes_sent']:,} | {out['bytes_received']:,} | "
              f"{out.get('replayed', 0)} | {out['params_sha256'][:16]}{'' if out['all_agree'] else ' (disagree)'} |")


if __name__ == "__main__":
    main()

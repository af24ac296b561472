"""Spot-check overhead: the same room of real ``daisy-peer`` processes (real aiortc data
channels on loopback, a real ``daisychain serve``) trains the same run at several
``--verify-rate`` values, interleaved (rate 0, 0.05, 0.2, ... then again), so that every
rate sees the same machine load; steps/s is each host's committed steps per second from its
first commit to its last (``steps_per_s`` of ``daisy-peer --json``). Every room is honest,
so every alarm is a false one: they are counted too. Run it in the private namespace:

    ./scripts/in-netns.sh .venv/bin/python -m bench.verify            # writes docs/RELIABILITY.md
    ./scripts/in-netns.sh .venv/bin/python -m bench.verify --rates 0,0.05 --repeat 1 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from bench.chaos import DOC, Peer, Server, put_section, reference_for

BEGIN, END = "<!-- bench/verify.py: begin -->", "<!-- bench/verify.py: end -->"


def room(server: Server, rate: float, peers: int, run: list[str], tmp: Path, n: int,
         timeout: float) -> dict:
    """One room: a host and ``peers - 1`` members; the host's JSON summary (or a failure)."""
    host = Peer(server.url, f"v{n}-host", ["--create-room", "--approve", "all", "--wait-peers",
                                          str(peers - 1), "--verify-rate", str(rate),
                                          "--aggregate", "star", "--json",  # the star at every rate
                                          *run], tmp)
    made = [host]
    try:
        m = host.wait_for(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})", 120)
        if not m:
            return {"error": "no room: " + host.stderr()[-300:]}
        made += [Peer(server.url, f"v{n}-m{i}", ["--room", m.group(1), "--json"], tmp)
                 for i in range(1, peers)]
        outs = []
        end = time.monotonic() + timeout
        for p in made:
            try:
                out, _ = p.proc.communicate(timeout=max(1.0, end - time.monotonic()))
            except Exception:  # noqa: BLE001 - TimeoutExpired: the room failed
                return {"error": f"{p.name} did not finish: " + p.stderr()[-300:]}
            if p.proc.returncode != 0:
                return {"error": f"{p.name} failed: " + p.stderr()[-300:]}
            outs.append(json.loads(out.strip().splitlines()[-1]))
        h = outs[0]
        return {"steps_per_s": h["steps_per_s"], "hashes": [o["params_sha256"] for o in outs],
                "alarms": sum(len(o.get("alarms", ())) for o in outs),
                "compute_s": h["compute_s"], "micro": [p["micro_batches"] for p in h["peers"]],
                "computed": sum(o.get("computed_micro_batches", 0) for o in outs)}
    finally:
        for p in made:
            p.kill()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="0,0.05,0.2,1", help="verify rates, comma-separated "
                    "(the first is the baseline; default 0,0.05,0.2,1)")
    ap.add_argument("--peers", type=int, default=3, help="peers per room (default 3)")
    ap.add_argument("--steps", type=int, default=100, help="steps per run (default 100)")
    ap.add_argument("--repeat", type=int, default=3, help="rooms per rate (default 3)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per room at most")
    ap.add_argument("--warmup", type=int, default=1, help="rooms at the first rate run first "
                    "and not counted (the first room pays for cold caches; default 1)")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/RELIABILITY.md")
    ap.add_argument("run", nargs="*", help="run settings after --, e.g. -- --hidden 32 "
                    "(default: daisychain train's defaults)")
    args = ap.parse_args(argv)
    if os.environ.get("DAISY_IN_NETNS") != "1":
        print("verify: run it inside the private network namespace: ./scripts/in-netns.sh "
              ".venv/bin/python -m bench.verify", file=sys.stderr)
        return 2
    rates = [float(r) for r in args.rates.split(",")]
    run = ["--steps", str(args.steps), "--seed", "5", *args.run]
    want = reference_for(run)
    plan = [(k, r) for k in range(args.repeat) for r in rates]  # interleaved
    got: dict[float, list[dict]] = {r: [] for r in rates}
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the peers
    server = Server().start()
    try:
        with tempfile.TemporaryDirectory(prefix="dc-verify-") as tmp:
            for w in range(args.warmup):
                res = room(server, rates[0], args.peers, run, Path(tmp), -1 - w, args.timeout)
                print(f"warm-up room (not counted): " + (res["error"] if "error" in res else
                      f"{res['steps_per_s']:.2f} steps/s"), file=sys.stderr)
            bar = tqdm(plan, desc="verify", unit="room")
            for n, (k, r) in enumerate(bar, 1):
                bar.set_postfix_str(f"rate {r:g}")
                res = room(server, r, args.peers, run, Path(tmp), n, args.timeout)
                got[r].append(res)
                bar.write(f"rate {r:<5g} room {k + 1}: " + (res["error"] if "error" in res else
                          f"{res['steps_per_s']:.2f} steps/s, alarms {res['alarms']}, on the "
                          f"reference hash: {all(h == want for h in res['hashes'])}"))
    finally:
        server.kill()
    base = statistics.median(x["steps_per_s"] for x in got[rates[0]] if "error" not in x)
    rows = [f"| --verify-rate | rooms | median steps/s | vs rate {rates[0]:g} | micro-batches "
            "computed per one committed (measured) | expected | false alarms | on the reference hash |",
            "|---|---|---|---|---|---|---|---|"]
    from daisychain.engine.settings import add_run_arguments, settings_from_args
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    n_micro = settings_from_args(p.parse_args(run)).hp.n_micro
    ok = True
    for r in rates:
        good = [x for x in got[r] if "error" not in x]
        on = sum(all(h == want for h in x["hashes"]) for x in good)
        ok &= on == len(got[r]) and all(x["alarms"] == 0 for x in good)
        med = statistics.median(x["steps_per_s"] for x in good) if good else float("nan")
        work = sum(x["computed"] for x in good) / max(1, len(good) * args.steps * n_micro)
        rows.append(f"| {r:g} | {len(good)}/{len(got[r])} | {med:.2f} | {med / base:.2f}x | "
                    f"{work:.3f} | {1 + r:.3f} | {sum(x['alarms'] for x in good)} | "
                    f"{on}/{len(got[r])} |")
    table = "\n".join(rows)
    print(table)
    if not args.no_write:
        import platform
        from datetime import datetime, timezone
        cmd = "./scripts/in-netns.sh .venv/bin/python -m bench.verify " + " ".join(argv or sys.argv[1:])
        honest = sum(len([x for x in got[r] if "error" not in x]) for r in rates) * args.steps
        put_section(DOC, BEGIN, END, f"""{table}

{args.peers} peers per room, {args.steps} steps per run (`{' '.join(run)}`, `daisychain train`'s defaults otherwise, {n_micro}
micro-batches per step, `--capacity 50` on each peer), {args.repeat} rooms per rate, interleaved, after {args.warmup} warm-up room(s) that are not counted. {honest} honest steps in
all, {sum(x['alarms'] for r in rates for x in got[r] if 'error' not in x)} alarms.

Command: `{cmd.strip()}`
Machine: {platform.machine()}, {os.cpu_count()} cores (shared with other work while it ran),
Python {platform.python_version()}, {datetime.now(timezone.utc):%Y-%m-%d}.""")
        print(f"wrote {DOC}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

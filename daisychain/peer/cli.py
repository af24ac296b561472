"""``daisy-peer``: a headless CPU worker that joins a DaisyChain room and trains with the
browser tabs and other peers in it, over WebRTC data channels.

    daisy-peer --server http://HOST:8787 --room K7QM-4XZP-9R      # join a private room
    daisy-peer --server http://HOST:8787 --network                # the room of your network
    daisy-peer --server http://HOST:8787 --create-room --wait-peers 2 --steps 200   # host a run
    daisy-peer ... --create-room --resume run.pt --steps 400 --save-checkpoint run.pt  # go on

At the end it prints ``params-sha256: <hex>``, the same line as ``daisychain train`` with the
same settings. ``--save-checkpoint PATH`` writes the replica's state as a ``.pt`` (at the end,
on Ctrl-C, and every ``--save-every`` steps); ``--resume PATH`` starts a hosted run from one.
A joiner given ``--task module:Name`` (a task of your own) trains only a run of that task's
data: a run on other data is refused in words.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import signal
import socket
import sys

from daisychain.meta import ENGINE_VERSION
from daisychain.engine.settings import (USER_ERRORS, ArgumentParser, add_run_arguments, capacity_arg,
                                       setting_type, settings_from_args)
from daisychain.engine.threads import add_threads_argument, threads_from
from daisychain.peer.progress import Progress


def add_trust_arguments(p: argparse.ArgumentParser) -> None:
    from daisychain.peer.faults import FAULTS
    from daisychain.peer.run import STRIKES, VERIFY_RATE

    g = p.add_argument_group("spot-checks (the host's settings are the run's)")
    g.add_argument("--verify-rate", type=setting_type("verify_rate"), default=VERIFY_RATE, metavar="R",
                   help="share of each step's micro-batches that a second peer also computes, "
                        f"compared bit for bit (default {VERIFY_RATE}; 0: off; 1: every one)")
    g.add_argument("--strikes", type=setting_type("strikes"), default=STRIKES, metavar="N",
                   help=f"remove a peer from the run after N mismatches (default {STRIKES})")
    add_aggregate_argument(g)
    g.add_argument("--fault", choices=sorted(FAULTS), default=None,
                   help="TESTING FAULT, off by default: make this peer a liar that corrupts "
                        "what it sends (" + "; ".join(f"{k}: {v}" for k, v in FAULTS.items()) + ")")


def add_aggregate_argument(g) -> None:
    from daisychain.peer.run.ring import AGGREGATES
    g.add_argument("--aggregate", choices=AGGREGATES, default="auto",
                   help="how a step's contributions are summed (the host's choice): star (at the "
                        "coordinator), ring (reduce-scatter + all-gather between the members; only "
                        "with --verify-rate 0: a ring hides the contributions from the spot-checks) "
                        "or auto (the ring when nothing is checked and the cost model says it is "
                        "faster; default)")


def aggregate_errors(args) -> str | None:
    if args.aggregate == "ring" and args.verify_rate > 0:
        return ("--aggregate ring needs --verify-rate 0: a ring hides each contribution from "
                "the spot-checks")
    return None


def add_checkpoint_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checkpoints")
    g.add_argument("--save-checkpoint", metavar="PATH", default=None,
                   help="write this replica's state as a .pt (torch.load reads it) at the end "
                        "of the run and when stopped (Ctrl-C)")
    g.add_argument("--save-every", type=setting_type("save_every"), default=0, metavar="N",
                   help="with --save-checkpoint: also every N steps (default 0: only at the end)")
    g.add_argument("--resume", metavar="PATH", default=None,
                   help="host: start the run from this .pt (checked; a file of another run "
                        "is refused with what differs); --steps is the run's total")


def checkpoint_errors(args) -> str | None:
    """What is wrong with the checkpoint flags, in words (None: fine)."""
    if args.save_every < 0:
        return "--save-every must be >= 0"
    if args.save_every and not args.save_checkpoint:
        return "--save-every needs --save-checkpoint PATH"
    return None


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="daisy-peer", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True, help="the DaisyChain server, e.g. http://127.0.0.1:8787")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--room", help="private room code to join (the host approves you)")
    where.add_argument("--network", action="store_true", help="join the room of your network (default)")
    where.add_argument("--create-room", action="store_true",
                       help="create a private room and host a run with the settings below")
    p.add_argument("--name", default=None, help="name shown to the room (default: host name)")
    p.add_argument("--capacity", type=capacity_arg, default=None, metavar="auto|N",
                   help="micro-batches per second (default auto: measured)")
    p.add_argument("--approve", choices=["all", "prompt", "none"], default="prompt",
                   help="host: who may join (default prompt: ask on the terminal)")
    p.add_argument("--wait-peers", type=setting_type("wait_peers"), default=0, metavar="K",
                   help="host: wait for K other peers before the first step (default 0)")
    add_checkpoint_arguments(p)
    add_trust_arguments(p)
    add_threads_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON summary at the end")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--verbose", action="store_true",
                   help="log the run's events (each step, sync and link) as well as its warnings")
    p.add_argument("--loopback", action="store_true",
                   help="gather only 127.0.0.1 ICE candidates (all peers on this machine)")
    p.add_argument("--luts", default=None, help=argparse.SUPPRESS)  # tests: another table set
    p.add_argument("--engine-version", default=ENGINE_VERSION, help=argparse.SUPPRESS)  # tests
    add_run_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from daisychain.peer.node import Node, NodeOptions, PeerFailed, print_summary
    from daisychain.peer.client import SignalingError
    from daisychain.peer.rtc import use_loopback_only
    from daisychain.task import is_task_ref, load_task, task_dataset
    from daisychain.units import LutError

    args = build_parser().parse_args(argv)
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID`: every thread's stack to stderr (a hung peer)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    progress = Progress(enabled=not (args.quiet or args.json), steps=None)
    logging.basicConfig(level=logging.WARNING, handlers=[progress.log_handler()])
    if args.verbose:  # ours only: aiortc's and aioice's INFO lines would bury them
        logging.getLogger("daisychain").setLevel(logging.INFO)
    settings = None
    problem = checkpoint_errors(args) or aggregate_errors(args) or (
        "--resume is for the host of a new run: add --create-room" if args.resume and not args.create_room
        else None)
    if problem:
        print(f"daisy-peer: error: {problem}", file=sys.stderr)
        return 2
    expect = None  # a joiner's own task: the run must train its data
    try:
        if args.create_room:
            settings = settings_from_args(args)
        elif is_task_ref(args.task):
            expect = task_dataset(load_task(args.task), args.task).fingerprint
    except USER_ERRORS as exc:
        print(f"daisy-peer: error: {exc}", file=sys.stderr)
        return 2
    if args.loopback:
        use_loopback_only()
    room = "new" if args.create_room else (args.room or "network")
    progress.steps = args.steps if settings else None
    try:
        node = Node(NodeOptions(server=args.server, room=room, name=args.name or socket.gethostname(),
                                capacity=args.capacity, approve=args.approve,
                                wait_peers=args.wait_peers, settings=settings, luts=args.luts,
                                engine_version=args.engine_version, on_event=progress.event,
                                on_room=progress.room, save_checkpoint=args.save_checkpoint,
                                save_every=args.save_every, resume=args.resume,
                                verify_rate=args.verify_rate, strikes=args.strikes,
                                fault=args.fault, aggregate=args.aggregate,
                                expect_dataset=expect,
                                threads=threads_from(args, "daisy-peer")))
    except LutError as exc:
        print(f"daisy-peer: error: {exc}", file=sys.stderr)
        return 2
    try:
        out = asyncio.run(node.main())
    except KeyboardInterrupt:
        progress.close()
        saved = f" (state saved to {args.save_checkpoint})" if args.save_checkpoint and node.run \
            and node.run.trainer is not None else ""
        print(f"daisy-peer: left the room{saved}", file=sys.stderr)
        return 130
    except (PeerFailed, SignalingError) as exc:
        progress.close()
        print(f"daisy-peer: {exc}", file=sys.stderr)
        return 1
    progress.close()
    print_summary(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Start the server and N headless peers on this machine, in one private room, and train
the run together over WebRTC; a browser tab can join the same room live.

Every connection of the demo's own peers stays on loopback (they gather only 127.0.0.1
candidates), so it runs on a machine with no network and exposes nothing. Browsers never use
loopback for WebRTC, so for a tab to join, ``--lan`` lets the peers gather this machine's
other interfaces too (the server still listens on 127.0.0.1 only). It ends with the
accuracy and ``params-sha256: <hex>``, equal to ``daisychain train`` with the same settings,
and prints that ``daisychain train ...`` command.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import sys

from aiohttp import web

from daisychain.engine.settings import (USER_ERRORS, add_run_arguments, setting_type,
                                       settings_from_args, train_command)
from daisychain.engine.threads import add_threads_argument, threads_from


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--peers", type=setting_type("peers"), default=3, help="headless peers to start (default 3)")
    p.add_argument("--port", type=setting_type("port"), default=8787,
                   help="server port on 127.0.0.1 (default 8787; 0: any free port)")
    p.add_argument("--lan", action="store_true",
                   help="let the peers use this machine's network interfaces for WebRTC so a "
                        "browser tab can join (default: loopback only, which browsers never use)")
    add_threads_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON summary at the end")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    from daisychain.peer.cli import add_aggregate_argument, add_checkpoint_arguments
    from daisychain.peer.run import VERIFY_RATE
    p.add_argument("--verify-rate", type=setting_type("verify_rate"), default=VERIFY_RATE, metavar="R",
                   help=f"share of each step's micro-batches also computed by a second peer "
                        f"(default {VERIFY_RATE}; 0: off)")
    add_aggregate_argument(p)
    add_checkpoint_arguments(p)
    add_run_arguments(p)


async def _serve(settings, port: int):
    from daisychain.server.app import create_app
    from daisychain.server.config import ServerConfig

    app = create_app(ServerConfig(host="127.0.0.1", port=port),
                     datasets={settings.ds.task: settings.ds})
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    for p in (port, 0) if port else (0,):
        try:
            site = web.TCPSite(runner, "127.0.0.1", p)
            await site.start()
            break
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or p == 0:
                raise
    return runner, site._server.sockets[0].getsockname()[1]


async def demo(args, settings) -> dict:
    from daisychain.peer.node import Node, NodeOptions
    from daisychain.peer.progress import Progress
    from daisychain.peer.rtc import use_loopback_only

    if not args.lan:
        use_loopback_only()
    runner, port = await _serve(settings, args.port)
    base = f"http://127.0.0.1:{port}"
    progress = Progress(enabled=not (args.quiet or args.json), steps=settings.steps, desc="demo")
    code_known = asyncio.get_running_loop().create_future()

    def on_room(code, node):
        if not code_known.done():
            code_known.set_result(code)

    host = Node(NodeOptions(server=base, room="new", name="demo-peer-1", approve="all",
                            wait_peers=args.peers - 1, settings=settings,
                            on_event=progress.event, on_room=on_room,
                            save_checkpoint=args.save_checkpoint, save_every=args.save_every,
                            resume=args.resume, verify_rate=args.verify_rate,
                            aggregate=args.aggregate, threads=args.threads_n))
    tasks = [asyncio.ensure_future(host.main())]
    try:
        await asyncio.wait({code_known, tasks[0]}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if tasks[0].done():
            tasks[0].result()  # the host failed before it had a room (e.g. --resume refused)
        code = await asyncio.wait_for(asyncio.shield(code_known), 1)
        join = (f"Join from a browser on this machine: {base}/?room={code}" if args.lan else
                f"To let a browser tab join ({base}/?room={code}), run the demo with --lan: "
                f"browsers do not use loopback for WebRTC")
        progress.write(f"DaisyChain demo: {args.peers} peers in room {code}. {join}")
        for i in range(2, args.peers + 1):
            node = Node(NodeOptions(server=base, room=code, name=f"demo-peer-{i}", threads=args.threads_n))
            tasks.append(asyncio.ensure_future(node.main()))
        results = await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        progress.close()
        await runner.cleanup()
    out = results[0]
    out["url"] = f"{base}/?room={code}"
    out["all_agree"] = len({r["params_sha256"] for r in results}) == 1 and all(r["agreed"] for r in results)
    return out


def run(args: argparse.Namespace) -> int:
    from daisychain.peer.cli import aggregate_errors, checkpoint_errors
    from daisychain.peer.node import PeerFailed, print_summary

    try:
        settings = settings_from_args(args)
        if args.peers < 1:
            raise ValueError("--peers must be >= 1")
        if checkpoint_errors(args) or aggregate_errors(args):
            raise ValueError(checkpoint_errors(args) or aggregate_errors(args))
    except (*USER_ERRORS, ValueError) as exc:
        print(f"daisychain demo: error: {exc}", file=sys.stderr)
        return 2
    args.threads_n = threads_from(args, "daisychain demo")  # every peer's
    try:
        out = asyncio.run(demo(args, settings))
    except PeerFailed as exc:
        print(f"daisychain demo: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"daisychain demo: cannot start the server: {exc}", file=sys.stderr)
        return 1
    out["train_command"] = train_command(args)
    if not args.json:
        print(f"the same run in one process (the same params-sha256): {out['train_command']}")
    print_summary(out, args.json)
    if not out["all_agree"]:
        print("daisychain demo: the peers' hashes differ", file=sys.stderr)
        return 1
    return 0

"""A desktop window (pywebview) around a local DaisyChain server and its page.

The server listens on 127.0.0.1 only; other devices join through a `daisychain serve` they
can reach. ``--probe S`` loads the page, prints what it shows as JSON and closes (an
"is my desktop set-up OK?" check).
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=0, help="local port (default: any free one)")
    p.add_argument("--room", default=None, help="open this private room code")
    p.add_argument("--probe", type=float, default=None, metavar="SECONDS",
                   help="load the page, print its title and status as JSON, then close")
    p.add_argument("--gui", default=None, help="pywebview GUI backend (default qt)")


def run(args: argparse.Namespace) -> int:
    from daisychain.desktop.app import run_desktop
    from daisychain.server.config import ServerConfig

    return run_desktop(ServerConfig(host="127.0.0.1", port=args.port), args.room, args.probe, args.gui)

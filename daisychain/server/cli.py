"""Serve the DaisyChain page, its modules, shaders and tables, and do WebSocket signaling.

Devices on one network find each other in their network room; ``?room=CODE`` is a private
room whose host approves each device.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from aiohttp import web

from .config import ConfigError, ServerConfig, load_ice_servers

_D = ServerConfig()

#: The limits of docs/SECURITY.md: (flag, ServerConfig field, type, help).
LIMIT_FLAGS = [
    ("--max-connections-per-address", "max_connections_per_address", int,
     "signaling connections open at once per client address (an IPv4 address, an IPv6 /64)"),
    ("--address-rate", "address_rate_per_s", float,
     "messages per second per client address, over all its connections"),
    ("--address-burst", "address_burst", int, "messages at once above --address-rate"),
    ("--join-requests-per-min", "join_requests_per_min", float,
     "requests to join private rooms per minute per client address"),
    ("--codes-per-min", "codes_per_min", float,
     "wrong room codes per minute per client address (then every code is refused a while)"),
    ("--max-pending-per-address", "max_pending_per_address", int,
     "join requests of one client address waiting in one room"),
    ("--deny-cooldown", "deny_cooldown_s", float,
     "seconds a denied address waits before it may ask the same room again"),
    ("--pending-timeout", "pending_timeout_s", float,
     "seconds a join request waits for the host before it expires"),
    ("--relay-bytes-per-s", "relay_bytes_per_s", float,
     "bytes per second one connection may have relayed (size times recipients)"),
    ("--relay-burst-bytes", "relay_burst_bytes", int, "bytes at once above --relay-bytes-per-s"),
    ("--room-updates-per-s", "room_updates_per_s", float,
     "room-state rounds per second per room; more changes coalesce"),
    ("--room-update-burst", "room_update_burst", int, "room-state rounds at once"),
    ("--send-queue", "send_queue", int, "frames waiting for one slow connection before it is dropped"),
    ("--send-queue-bytes", "send_queue_bytes", int,
     "bytes waiting for one slow connection before it is dropped"),
    ("--max-sockets", "max_sockets", int,
     "TCP connections open in all (kept below the open-file limit)"),
    ("--max-sockets-per-address", "max_sockets_per_address", int,
     "TCP connections open per client address (trusted proxies exempt)"),
    ("--header-timeout", "header_timeout_s", float,
     "seconds to send a request's headers, or to idle between requests"),
    ("--body-timeout", "body_timeout_s", float, "seconds for an upload to arrive in full"),
    ("--max-uploads", "max_uploads", int, "uploads read at once; more get 503"),
    ("--max-upload-bytes", "max_upload_bytes", int, "largest upload"),
    ("--room-uploads", "room_uploads", int, "uploaded data sets one room keeps until it closes"),
    ("--room-upload-bytes", "room_upload_bytes", int,
     "bytes of uploaded data one room keeps (as DCDS)"),
    ("--address-upload-bytes", "address_upload_bytes", int,
     "bytes of uploaded data one client address keeps, over all its rooms"),
    ("--uploads-per-min", "uploads_per_min", float, "data uploads per minute per client address"),
    ("--parses-per-address", "parses_per_address", int,
     "uploads of one client address parsed at once"),
    ("--parse-workers", "parse_workers", int, "threads parsing uploads, for all rooms"),
    ("--parse-timeout", "parse_timeout_s", float, "seconds a parse may take; then 503"),
    ("--upload-max-columns", "upload_max_columns", int, "columns an uploaded CSV may have"),
    ("--upload-max-rows", "upload_max_rows", int, "rows an uploaded CSV may have"),
    ("--upload-max-classes", "upload_max_classes", int,
     "distinct characters an uploaded text may have (the text task's classes)"),
    ("--qr-per-min", "qr_per_min", float, "QR codes drawn per minute per client address"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=_D.host, help="address to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=_D.port, help="port (default %(default)s; 0: any)")
    parser.add_argument("--trust-proxy", metavar="CIDR", nargs="+", action="extend", default=[],
                        help="reverse proxies whose X-Forwarded-For is believed (default: none)")
    parser.add_argument("--ice-servers", metavar="FILE",
                        help="JSON list of RTCIceServer objects (STUN/TURN) for clients "
                             "(default: none, enough on one network)")
    parser.add_argument("--data", metavar="FILE_OR_HF_NAME", action="append", default=[],
                        help="a text dataset hosts may train on (repeatable; listed by /datasets)")
    parser.add_argument("--uploads-by", choices=("host", "members"), default=_D.uploads_by,
                        help="who in a room may upload data for it (default %(default)s)")
    parser.add_argument("--image-data", metavar="SOURCE", action="append", default=[],
                        help="an image dataset hosts may train on (--task image --data SOURCE: "
                             ".npz, class folders, HF .parquet/.arrow or HF name; repeatable)")
    parser.add_argument("--image-size", type=int, default=None, metavar="N",
                        help="resize the --image-data sets to N x N")
    parser.add_argument("--hub", action="store_true",
                        help="let a room's host name a Hugging Face data set that this server "
                             "fetches (its first rows, streamed) for the room, under the room's "
                             "upload credential and quotas (default: off)")
    parser.add_argument("--hub-max-rows", type=int, default=_D.hub_max_rows, metavar="N",
                        help="with --hub: the most rows one fetch reads (default %(default)s)")
    parser.add_argument("--hub-mirror", default="", metavar="DIR",
                        help="with --hub: read owner/name from DIR/owner/name (parquet files in "
                             "the Hub's layout) instead of the Hub")
    parser.add_argument("--task", metavar="MODULE:NAME", action="append", default=[], dest="tasks",
                        help="a task of your own whose data hosts may train on (its data(), "
                             "served like --data; repeatable)")
    lim = parser.add_argument_group("limits")
    lim.add_argument("--max-message-bytes", type=int, default=_D.max_message_bytes,
                     help="largest signaling message (default %(default)s)")
    lim.add_argument("--rate", type=float, default=_D.rate_per_s, dest="rate_per_s",
                     help="messages per second per connection (default %(default)s)")
    lim.add_argument("--burst", type=int, default=_D.burst,
                     help="messages allowed at once above the rate (default %(default)s)")
    lim.add_argument("--max-room-size", type=int, default=_D.max_room_size,
                     help="devices per room (default %(default)s)")
    lim.add_argument("--max-pending", type=int, default=_D.max_pending,
                     help="join requests waiting per room (default %(default)s)")
    lim.add_argument("--max-rooms-per-address", type=int, default=_D.max_rooms_per_address,
                     help="private rooms open per client address (default %(default)s)")
    lim.add_argument("--grace", type=float, default=_D.grace_s, dest="grace_s",
                     help="seconds a dropped device may reconnect as itself (default %(default)s)")
    lim.add_argument("--ping-interval", type=float, default=_D.ping_interval_s,
                     dest="ping_interval_s",
                     help="seconds between pings; silent connections are dropped (default %(default)s)")
    for flag, dest, kind, text in LIMIT_FLAGS:
        lim.add_argument(flag, type=kind, default=getattr(_D, dest), dest=dest,
                         help=text + " (default %(default)s)")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    ice = tuple(load_ice_servers(args.ice_servers)) if args.ice_servers else ()
    return ServerConfig(host=args.host, port=args.port, trust_proxy=tuple(args.trust_proxy),
                        ice_servers=ice, max_message_bytes=args.max_message_bytes,
                        rate_per_s=args.rate_per_s, burst=args.burst,
                        max_room_size=args.max_room_size, max_pending=args.max_pending,
                        max_rooms_per_address=args.max_rooms_per_address,
                        grace_s=args.grace_s, ping_interval_s=args.ping_interval_s,
                        uploads_by=args.uploads_by, hub=args.hub, hub_max_rows=args.hub_max_rows,
                        hub_mirror=args.hub_mirror,
                        **{dest: getattr(args, dest) for _, dest, _, _ in LIMIT_FLAGS})


async def serve(config: ServerConfig, app: web.Application | None = None,
                started: asyncio.Event | None = None) -> None:
    """Run until cancelled (Ctrl-C or SIGTERM), then shut down cleanly."""
    from .app import create_app
    from .guard import GuardedRunner, raise_file_limit, socket_cap

    files = raise_file_limit()
    runner = GuardedRunner(app or create_app(config), config, socket_cap(config, files))
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        host = f"[{config.host}]" if ":" in config.host else config.host
        print(f"DaisyChain serving on http://{host}:{port}/  (Ctrl-C to stop)", flush=True)
        if started is not None:
            started.set()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGTERM, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
        await stop.wait()
    finally:
        await runner.cleanup()


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"daisychain serve: {exc}", file=sys.stderr)
        return 2
    try:
        from .app import create_app
        from daisychain.engine.data import DataError, prepare_task
        sets, flag = {}, "--data"
        for src in args.data:
            sets[src] = prepare_task("text", src)
        flag = "--image-data"
        for src in args.image_data:
            sets[src] = prepare_task("image", src, image_size=args.image_size)
        flag = "--task"
        from daisychain.task import load_task, task_dataset
        for ref in args.tasks:
            sets[ref] = task_dataset(load_task(ref), ref)
    except DataError as exc:
        print(f"daisychain serve: {flag}: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(config, create_app(config, datasets=sets) if sets else None))
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    except OSError as exc:
        print(f"daisychain serve: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="daisychain serve", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    sys.exit(run(p.parse_args()))

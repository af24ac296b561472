"""The one guard every upload route goes through, and the shelf of each room's uploads.

:class:`UploadGuard` (one per app, ``GUARD_KEY``) answers, in this order, for a request that
sends the server a file:

A route that keeps what it is sent calls :meth:`UploadGuard.receive` (steps 1-3), then
:meth:`UploadGuard.work` (step 4) and :meth:`Shelf.add`; ``routes.datasets.upload`` is the
example. A route that keeps nothing calls :meth:`UploadGuard.body` and :meth:`UploadGuard.work`.

1. **who** — :meth:`UploadGuard.member`: the device's credential, its signaling session
   token (``welcome.token``), in the ``X-Daisy-Token`` header (never in the URL). No
   credential or a stale one: 401; not an approved member of a room, or (with
   ``--uploads-by host``, the default) not its host: 403. Routes that keep nothing (the
   checkpoint conversions) skip this step.
2. **how often** — :meth:`UploadGuard.charge`: uploads per minute per client address
   (``--uploads-per-min``): 429 with ``retry_after_s``.
3. **the body** — ``guard.read_body``: ``Content-Length`` against the limit before reading,
   ``--body-timeout``, ``--max-uploads`` at once; a client that resets mid-body is counted
   and logged once per 10 s, without a traceback.
4. **the work** — :meth:`UploadGuard.work`: the parse runs in a pool of ``--parse-workers``
   threads that only uploads use, at most ``--parses-per-address`` at once per address and
   ``2 x --parse-workers`` in all (503 beyond), answered within ``--parse-timeout`` (503).
   What a parse may cost is bounded before it starts by what the route checks (a data
   upload's columns, rows and distinct characters).

:class:`Shelf` keeps uploaded data sets per room: at most ``--room-uploads`` sets and
``--room-upload-bytes`` per room, ``--address-upload-bytes`` per uploading address; a full
room refuses (429/413), it never pushes anything out, and no room's uploads can push out
another's. A room's sets go when the room closes (its last member gone, after the grace a
dropped member gets): :meth:`UploadGuard.sweep`, on the server's timer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from aiohttp import web

from .config import ServerConfig
from .groups import address_key, client_address
from .guard import CUT, read_body, refusal
from .quota import Bucket
from .rooms import Hub, PeerInfo

log = logging.getLogger("daisychain.server")

CREDENTIAL_HEADER = "X-Daisy-Token"
MAX_TOKEN_CHARS = 64


@dataclass
class Upload:
    data: bytes        # the DCDS (kept as bytes only: served as they are, never copied)
    entry: dict        # its /datasets entry
    address: str       # the uploader's address key

    @property
    def nbytes(self) -> int:
        return len(self.data)


class Shelf:
    """Uploaded data sets by room (key: ``PeerInfo.room_key``), then by fingerprint."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.rooms: dict[str, OrderedDict[str, Upload]] = {}
        self.by_address: Counter = Counter()  # bytes kept per uploader address
        self.dropped_rooms = 0

    def room_bytes(self, room: str) -> int:
        return sum(u.nbytes for u in self.rooms.get(room, {}).values())

    def check_count(self, room: str, fingerprint: str | None = None) -> None:
        """429 when the room keeps as many sets as it may (a set it has already is fine)."""
        sets = self.rooms.get(room, {})
        cap = self.config.room_uploads
        if len(sets) >= cap and fingerprint not in sets:
            raise refusal(f"your room keeps {len(sets)} uploaded data sets already, its limit; "
                          f"they go when the room closes", 429, limit=cap, current=len(sets))

    def add(self, room: str, address: str, ds, entry: dict) -> None:
        cfg = self.config
        fp = ds.fingerprint
        self.check_count(room, fp)
        sets = self.rooms.setdefault(room, OrderedDict())
        old = sets.get(fp)
        data = ds.to_bytes()
        nbytes = len(data)
        held = self.room_bytes(room) - (old.nbytes if old else 0)
        if held + nbytes > cfg.room_upload_bytes:
            raise refusal(f"this data set is {nbytes} bytes on the server; your room keeps "
                          f"{held} already and its limit is {cfg.room_upload_bytes}", 413,
                          limit=cfg.room_upload_bytes, current=held + nbytes)
        mine = self.by_address[address] - (old.nbytes if old and old.address == address else 0)
        if mine + nbytes > cfg.address_upload_bytes:
            raise refusal(f"this data set is {nbytes} bytes on the server; your address keeps "
                          f"{mine} already and its limit is {cfg.address_upload_bytes}", 413,
                          limit=cfg.address_upload_bytes, current=mine + nbytes)
        if old is not None:
            self._release(old)
        sets[fp] = Upload(data, entry, address)
        self.by_address[address] += nbytes

    def get(self, room: str | None, fingerprint: str) -> Upload | None:
        return self.rooms.get(room, {}).get(fingerprint) if room else None

    def entries(self, room: str | None) -> list[dict]:
        """The room's sets, newest first."""
        return [u.entry for u in reversed(self.rooms.get(room, {}).values())] if room else []

    def drop_closed(self, is_open: Callable[[str], bool]) -> None:
        for room in [r for r in self.rooms if not is_open(r)]:
            for u in self.rooms.pop(room).values():
                self._release(u)
            self.dropped_rooms += 1

    def _release(self, u: Upload) -> None:
        self.by_address[u.address] -= u.nbytes
        if self.by_address[u.address] <= 0:
            del self.by_address[u.address]

    def stats(self) -> dict:
        cfg = self.config
        return {"rooms": len(self.rooms), "sets": sum(len(s) for s in self.rooms.values()),
                "bytes": sum(self.by_address.values()),
                "room_uploads": {"limit": cfg.room_uploads,
                                 "current": max(map(len, self.rooms.values()), default=0)},
                "room_upload_bytes": {"limit": cfg.room_upload_bytes,
                                      "current": max(map(self.room_bytes, self.rooms), default=0)},
                "address_upload_bytes": {"limit": cfg.address_upload_bytes,
                                         "current": max(self.by_address.values(), default=0)},
                "rooms_closed": self.dropped_rooms}


class UploadGuard:
    """Credential, per-address rate, body limits and a bounded parse pool for uploads."""

    def __init__(self, config: ServerConfig, hub: Hub):
        self.config, self.hub = config, hub
        self.shelf = Shelf(config)
        self.pool = ThreadPoolExecutor(max_workers=config.parse_workers,
                                       thread_name_prefix="daisy-parse")
        self.rates: dict[tuple[str, str], Bucket] = {}
        self.parsing: Counter = Counter()  # per address key: parses running or queued
        self.busy = 0                      # parses running or queued, in all
        self.refused: Counter = Counter()

    # -- who ---------------------------------------------------------------------------------

    def address(self, request: web.Request) -> str:
        cfg = self.config
        ip = client_address(request.remote, request.headers.get("X-Forwarded-For"),
                            cfg.trusted_networks)
        return address_key(str(ip) if ip else request.remote)

    def viewer(self, request: web.Request) -> PeerInfo | None:
        """The approved room member whose credential the request carries, or None."""
        token = request.headers.get(CREDENTIAL_HEADER, "")
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        who = self.hub.authenticate(token)
        return who if who is not None and who.approved and who.room_key else None

    def member(self, request: web.Request, *, upload: bool = False) -> PeerInfo:
        """The approved member of a room that sends this request (with ``upload``: one
        allowed to upload for it); raises 401/403 with the reason in words."""
        token = request.headers.get(CREDENTIAL_HEADER, "")
        if not token:
            self.refused["no_credential"] += 1
            raise refusal(f"this needs your room's credential (the page sends it in the "
                          f"{CREDENTIAL_HEADER} header once it has joined a room)", 401)
        who = self.hub.authenticate(token) if len(token) <= MAX_TOKEN_CHARS else None
        if who is None:
            self.refused["bad_credential"] += 1
            raise refusal("your room credential is not (or no longer) valid: reload the page "
                          "and join the room again", 401)
        if not who.approved or not who.room_key:
            self.refused["not_member"] += 1
            raise refusal("you are not an approved member of a room", 403)
        if upload and self.config.uploads_by == "host" and not who.host:
            self.refused["not_host"] += 1
            raise refusal("only the room's host may upload data on this server "
                          "(daisychain serve --uploads-by host)", 403)
        return who

    # -- how often -----------------------------------------------------------------------------

    def charge(self, request: web.Request, kind: str, per_min: float) -> None:
        """Take one from ``request``'s address's ``kind`` bucket (``per_min``, also the
        burst); 429 with ``retry_after_s`` when it is spent."""
        now = time.monotonic()
        key = (kind, self.address(request))
        bucket = self.rates.get(key)
        if bucket is None:
            if len(self.rates) > 4096:  # forget the addresses whose buckets are full again
                self.rates = {k: b for k, b in self.rates.items() if not b.full(now)}
            bucket = self.rates[key] = Bucket(per_min / 60.0, per_min, now)
        if not bucket.take(now):
            self.refused[f"{kind}_rate"] += 1
            wait = bucket.wait_s()
            raise refusal(f"too many {kind} requests from your address: the limit is "
                          f"{per_min:g} per minute; try again in {wait:.0f} s", 429,
                          limit=per_min, current=per_min, retry_after_s=max(1, round(wait)))

    # -- the body --------------------------------------------------------------------------

    async def body(self, request: web.Request, limit: int) -> bytes:
        return await read_body(request, self.config, limit)

    async def receive(self, request: web.Request, limit: int) -> tuple[PeerInfo, bytes]:
        """Steps 1-3 for a route that keeps what it is sent for a room (data, images): the
        sender (allowed to upload for its room, which has room for one more set), charged
        one upload, and the body. Then: ``work(request, parse, body, ...)`` and
        ``shelf.add(who.room_key, address(request), dataset, entry)``."""
        who = self.member(request, upload=True)
        self.shelf.check_count(who.room_key)
        self.charge(request, "upload", self.config.uploads_per_min)
        return who, await self.body(request, limit)

    # -- the work --------------------------------------------------------------------------

    async def work(self, request: web.Request, fn: Callable, *args):
        """``fn(*args)`` in the parse pool, within the per-address and total caps and the
        parse timeout (503 past any of them)."""
        cfg = self.config
        key = self.address(request)
        if self.parsing[key] >= cfg.parses_per_address:
            self.refused["parses_per_address"] += 1
            raise refusal(f"your address has {self.parsing[key]} uploads being parsed, its "
                          f"limit; try again when they are done", 503,
                          limit=cfg.parses_per_address, current=self.parsing[key],
                          retry_after_s=5)
        if self.busy >= 2 * cfg.parse_workers:
            self.refused["parse_queue"] += 1
            raise refusal(f"the server is parsing {self.busy} uploads, its limit; try again "
                          f"in a few seconds", 503, limit=2 * cfg.parse_workers,
                          current=self.busy, retry_after_s=5)
        self.parsing[key] += 1
        self.busy += 1

        def done(_fut) -> None:  # when the thread is really done, not when we stop waiting
            self.busy -= 1
            self.parsing[key] -= 1
            if self.parsing[key] <= 0:
                del self.parsing[key]

        fut = asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        fut.add_done_callback(done)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), cfg.parse_timeout_s)
        except TimeoutError:
            self.refused["parse_timeout"] += 1
            raise refusal(f"parsing this upload took longer than {cfg.parse_timeout_s:g} s, "
                          f"the limit", 503, limit=cfg.parse_timeout_s,
                          current=cfg.parse_timeout_s, retry_after_s=5) from None

    # -- upkeep ----------------------------------------------------------------------------

    def sweep(self) -> None:
        """Forget the uploads of rooms that closed."""
        self.shelf.drop_closed(self.hub.has_room)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict:
        cfg = self.config
        return {**self.shelf.stats(), "parsing": {"limit": 2 * cfg.parse_workers,
                                                  "current": self.busy},
                "parses_per_address": {"limit": cfg.parses_per_address,
                                       "current": max(self.parsing.values(), default=0)},
                "cut_mid_body": CUT.count, "refused": dict(self.refused)}


GUARD_KEY = web.AppKey("daisychain_upload_guard", UploadGuard)


_FALLBACK: dict[int, UploadGuard] = {}  # apps not made by create_app


def guard_of(request: web.Request) -> UploadGuard:
    """The app's guard (for apps not built by ``create_app``, one of their own)."""
    guard = request.app.get(GUARD_KEY)
    if guard is None:
        from .keys import CONFIG_KEY, HUB_KEY

        config = request.app.get(CONFIG_KEY) or ServerConfig()
        guard = _FALLBACK.get(id(request.app))
        if guard is None:
            guard = _FALLBACK[id(request.app)] = UploadGuard(
                config, request.app.get(HUB_KEY) or Hub(config))
    return guard

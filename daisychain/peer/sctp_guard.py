"""A bound on what one remote peer can make aiortc reassemble.

aiortc announces ``a=max-message-size:262144`` in its SDP (``LOCAL_MAX_MESSAGE_SIZE``) but
does not enforce it on receipt: a peer that lifts its own send limit can send one message of
64 MiB, and aiortc's ``InboundStream.pop_messages`` scans the whole chunk list for every chunk
that arrives (the cost grows with the square of the size: a room ran at 1.2 steps/s for ~65 s
under one such message, issue 35). Here every inbound stream counts the bytes it holds for
reassembly; past :data:`MAX_REASSEMBLY` the association is aborted (the peer's channels
close, so the run sees a member leave) and none of its chunks is reassembled.

:data:`MAX_REASSEMBLY` is the announced maximum message plus the receive window aiortc
advertises (1 MiB): a peer that keeps both limits never comes near it, whatever the order
its chunks arrive in. :func:`install` patches the module once per process (daisy-peer's own);
it changes nothing for a peer that keeps the limits.
"""

from __future__ import annotations

import logging

from aiortc import rtcsctptransport as _sctp

log = logging.getLogger("daisychain.peer")

#: the maximum message size this side announces in its SDP (aiortc's)
MAX_MESSAGE_SIZE = _sctp.LOCAL_MAX_MESSAGE_SIZE
#: the most user-data bytes one inbound stream may hold for reassembly
MAX_REASSEMBLY = MAX_MESSAGE_SIZE + 1024 * 1024


class MessageTooLarge(Exception):
    """A peer's chunks held for reassembly passed :data:`MAX_REASSEMBLY`."""


class BoundedInboundStream(_sctp.InboundStream):
    """aiortc's inbound stream, counting the bytes it holds (:attr:`held`)."""

    def __init__(self) -> None:
        super().__init__()
        self.held = 0

    def add_chunk(self, chunk) -> None:
        if self.held + len(chunk.user_data) > MAX_REASSEMBLY:
            raise MessageTooLarge(
                f"a peer's data channel held {self.held + len(chunk.user_data)} bytes for "
                f"reassembly, past the {MAX_MESSAGE_SIZE}-byte maximum message it was told "
                f"(a=max-message-size) plus the receive window")
        before = len(self.reassembly)
        super().add_chunk(chunk)
        if len(self.reassembly) > before:
            self.held += len(chunk.user_data)

    def pop_messages(self):
        for message in super().pop_messages():
            self.held -= len(message[2])
            yield message

    def prune_chunks(self, tsn: int) -> int:
        size = super().prune_chunks(tsn)
        self.held -= size
        return size


_receive_data_chunk = _sctp.RTCSctpTransport._receive_data_chunk


async def _bounded_receive_data_chunk(self, chunk) -> None:
    try:
        await _receive_data_chunk(self, chunk)
    except MessageTooLarge as exc:
        log.warning("%s: the connection is dropped", exc)
        self._inbound_streams.clear()  # nothing of it is reassembled
        await self._abort()
        self._set_state(self.State.CLOSED)


def install() -> None:
    """Bound every aiortc SCTP association of this process (idempotent)."""
    _sctp.InboundStream = BoundedInboundStream
    _sctp.RTCSctpTransport._receive_data_chunk = _bounded_receive_data_chunk

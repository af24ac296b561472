"""What the Hub answers with: the frames to send and the connections to close."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from daisychain import signaling as p

#: WebSocket close codes the hub asks for.
CLOSE_POLICY = 1008      # flood
CLOSE_GOING_AWAY = 1001  # shutdown
CLOSE_REPLACED = 4001
CLOSE_IDLE = 4002


@dataclass(frozen=True)
class Send:
    conn: int
    message: p.ServerMessage


@dataclass(frozen=True)
class Close:
    conn: int
    code: int
    reason: str


Output = Union[Send, Close]

"""What a replica's run asks its shell to do (``Send``, ``Compute``, ``FetchData``) and the
events it reports (``Committed``, ``Refused``, ``Log``, ``Ended``, ``Restored``, ``Alarm``,
``Removed``). A role's change to its driver is an output too, ``Setting``, which the driver
applies and passes on to nobody."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import numpy as np

from daisychain.peer import frames as F

@dataclass(frozen=True)
class Send:
    to: str
    message: F.RunMessage


@dataclass(frozen=True)
class Compute:
    """Compute the integer sum of ``micro`` of ``step`` on ``theta`` (a private copy), then
    call ``computed(step, task, result, term)``: ``term``, the term it was asked in, tells a
    result of an older term (a hand-over renumbers the tasks) from one of the same task now."""
    step: int
    task: int
    micro: tuple[int, ...]
    theta: np.ndarray = field(repr=False, compare=False)
    term: int | None = None


@dataclass(frozen=True)
class FetchData:
    """Fetch the dataset bytes (``/data/<task>.dcds``), then call ``data(bytes or None)``."""
    task: str
    fingerprint: str


@dataclass(frozen=True)
class Committed:
    step: int          #: the step that was applied (the replica is now at step + 1)
    loss: float
    contributors: tuple[tuple[str, int], ...]
    mine: int          #: micro-batches of this peer in it
    params_sha256: str


@dataclass(frozen=True)
class Refused:
    peer: str          #: who refused (this peer's own id when it refuses)
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Log:
    text: str
    loud: bool = False


@dataclass(frozen=True)
class Ended:
    step: int
    params_sha256: str
    agreed: bool       #: this replica's hash equals the coordinator's


@dataclass(frozen=True)
class Restored:
    """This replica now holds a restored checkpoint state (``by``: the coordinator)."""
    step: int
    params_sha256: str
    by: str


@dataclass(frozen=True)
class Alarm:
    """A peer sent what an honest replica cannot have sent. ``kind``: ``mismatch`` (a
    spot-check found its contribution differs from the reference), ``refused`` (a malformed
    message or a contribution over the clamp bound), ``removed`` (it reached the run's
    strikes and takes no further part)."""
    kind: str
    peer: str
    name: str
    step: int
    micro: int | None
    strikes: int
    text: str


@dataclass(frozen=True)
class Removed:
    """The coordinator ``by`` removed this replica from the run (``reason``: its words)."""
    by: str
    reason: str


class RestoreError(ValueError):
    """A state the coordinator cannot restore (wrong size, hash, or not the coordinator)."""


@dataclass(frozen=True)
class Setting:
    """A role changes its driver (:class:`~.context.RunContext` is read-only): ``name`` is
    one of :data:`~.context.SETTINGS`. The driver applies it; the shell never sees it."""
    name: str
    value: object


Output = Union[Send, Compute, FetchData, Committed, Refused, Log, Ended, Restored, Alarm, Removed, Setting]


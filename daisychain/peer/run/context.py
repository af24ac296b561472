"""What a role reads of its driver: :class:`RunContext`, a read-only view of the room, the
clock and the run's settings. A role never writes to the driver; a change it needs (the
announce's settings, the host named before, the measured capacity, the run's length) it
returns as a :class:`~.outputs.Setting` output, which the driver applies when the role's call
returns. The micro-batches each peer did are counted by the driver from the ``Committed``
outputs, and the host's wait for members is the driver's to end once a coordinator took it."""

from __future__ import annotations

#: what a role reads of the driver
READS = frozenset({"me", "now", "open", "room", "names", "host", "prev_host", "capacity", "steps",
                   "verify_rate", "strikes", "verify_key", "aggregate", "window_size", "kind",
                   "selftest", "wait_peers", "make_trainer"})
#: what a role may change, by a ``Setting`` output
SETTINGS = frozenset({"steps", "verify_rate", "strikes", "prev_host", "capacity"})


class RunContext:
    """A role's read-only view of ``driver`` (the names in :data:`READS`, and ``_name``)."""

    __slots__ = ("_driver",)

    def __init__(self, driver):
        object.__setattr__(self, "_driver", driver)

    def __getattr__(self, name: str):
        if name in READS:
            return getattr(self._driver, name)
        raise AttributeError(f"a role reads no {name!r} of its driver")

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"the run context is read-only: {name!r} changes by a Setting output")

    def _name(self, peer: str) -> str:
        return self._driver._name(peer)

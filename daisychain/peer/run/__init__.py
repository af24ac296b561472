"""The run and its steps as plain objects: no sockets, no clock, no threads.

:class:`RunPeer` is one replica's view of a run. The shell (``rtc.py`` / ``cli.py``) feeds it
what happens — ``receive(sender, message)`` (a decoded data-channel message),
``room_changed(ids, host)`` (the signaling room changed), ``channel_open(peer)``,
``computed(step, task, result)`` (a compute it asked for finished), ``data(bytes|None)``
(the dataset fetch it asked for), ``tick(now)`` — and performs what it answers:
:class:`Send`, :class:`Compute`, :class:`FetchData` and events (:class:`Committed`,
:class:`Refused`, :class:`Log`, :class:`Ended`, :class:`Removed`, ...).

The room host is the step *coordinator*. It announces the run (:class:`~frames.Run`); each
member checks the identity and its own self-test and answers ``Ready`` (with its state's
step and hash) or ``Refuse``. A member whose state differs gets the coordinator's STATE.
Per step the coordinator splits the micro-batch ids into *tasks* by capacity and by what
each member's link costs a step (:func:`finish_shares`: everyone finishes together, each
live member keeps at least one micro-batch); each task
is committed from exactly one contribution (the first that arrives from one of its
assignees, with the task's exact micro-batch list), so each micro-batch counts exactly
once. A task whose peer leaves is split over the others; a task past its adaptive
deadline gets a backup assignee. When every task has a contribution the coordinator sums
them, applies the total, and sends it (TOTAL) with its new parameter hash to everyone;
each member applies it and compares hashes (mismatch: loud report, resync).

Hand-over: when the signaling server names another host, that peer becomes coordinator
with ``term + 1`` and restarts the step it holds; members report their state and whoever
is behind (the new coordinator included) is brought forward by STATE.

Rollback: when a liar is removed (strikes), every step in the coordinator's rollback window
(:mod:`.rollback`) with an unchecked contribution of it is undone: the room goes back to
the state before the earliest one (a new term; each member gets ``restore`` + STATE) and
computes those steps again without it.

Hand-over is composition, not a flag: the driver :class:`RunPeer` always holds a
:class:`~.member.Member` (the replica) and, while this peer is the host, a
:class:`~.coordinator.Coordinator` built from that member's state; stepping down drops it.

Modules, one role each: :mod:`.driver` (the thin :class:`RunPeer` that routes inputs to the
role objects), :mod:`.member`, :mod:`.coordinator`, :mod:`.trust` (the coordinator's
:class:`~.trust.Trust`: verdicts, strikes, removal, rollback),
:mod:`.checks` (pure spot-check functions), :mod:`.split`, :mod:`.aggregator`,
:mod:`.rollback`, :mod:`.state` (the one state loader), :mod:`.outputs`, :mod:`.context`
(the roles' read-only view of the driver; their changes to it are ``Setting`` outputs).
"""

from daisychain.peer.run.checks import checked_micro, verdict  # noqa: F401
from daisychain.peer.run.catchup import RESTORE_WAIT_S, SYNC_WAIT_S  # noqa: F401
from daisychain.peer.run.coordinator import DEADLINE_FACTOR, MIN_DEADLINE_S, START_WAIT_S  # noqa: F401
from daisychain.peer.run.driver import STRIKES, VERIFY_RATE, RunPeer, message_name  # noqa: F401
from daisychain.peer.run.outputs import (  # noqa: F401
    Alarm, Committed, Compute, Ended, FetchData, Log, Output, Refused, Removed, RestoreError, Restored,
    Send)
from daisychain.peer.run.rollback import Window, window_steps  # noqa: F401
from daisychain.peer.run.split import (  # noqa: F401
    contribute_at, contribute_timed, finish_shares, measure_capacity, split_tasks)
from daisychain.peer.run.state import tensor_bounds  # noqa: F401
from daisychain.peer.run.coordinator import Coordinator, _Check, _Member, _Task  # noqa: F401  (tests build these)
from daisychain.peer.run.member import Member  # noqa: F401

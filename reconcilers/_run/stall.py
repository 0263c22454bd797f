"""When a worker's consumer has stopped consuming without exiting.

Celery's Redis consumer can stop taking messages after its broker connection is reset, with
nothing logged and the process alive (celery/celery#10302, open in the versions this project
pins): the ledger loses nothing - every key stays queued and the reaper keeps re-sending - but
nothing runs until the worker restarts. So the worker's liveness (``/healthz``) reports it,
and its orchestrator restarts it as for any hung process: a worker is stalled when a message
has waited next in one of its queues longer than ``RECONCILERS_WORKER_STALLED_AFTER``, it
received none for as long, and it runs nothing now. A busy worker is never called stalled (it
takes no message while its slots are full), nor one that cannot tell (the broker down, a
broker that keeps no list to look into): readiness reports an unreachable broker, and
restarting a worker would not bring it back.

Every time here is this process's monotonic clock. A message carries its send time by the
database's clock (the ledger stamps it for the reaper, which compares it in SQL with the same
clock), but this host's clock may be off from the database's by any amount: ahead, a message
just sent would look long waiting and an idle worker stalled; behind, a stopped consumer would
never be seen. So a message's wait is timed from when this worker first saw it next in line
(``Sightings``): one that was already waiting when the worker went quiet is called stalled up
to one bound later than its send time would say.

A slot held past any end a task can have is not busy but stuck (``overdue``): neither pool
lets a run go on past its hard limit (prefork ends the child, the thread pool abandons the
run), and the periodic tasks have none but end in seconds. A thread-pool worker whose every
Celery thread waits on a call that never returns - a statement sent to a frozen PostgreSQL,
whose kernel still acknowledges the bytes, so no TCP timeout ends the wait - takes no message
again; it is called stalled, and restarted, once its tasks are that far overdue.

Compose restarts a process that exits, never one that fails its health check: so a worker
still stalled ``RECONCILERS_WORKER_STALLED_AFTER`` after it was first seen ends itself
(``end``). An orchestrator probing ``/healthz`` (the kubelet) restarts it sooner.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Mapping

log = logging.getLogger(__name__)

# The exit status of a stalled worker that ended itself (EX_TEMPFAIL: starting it again cures
# it).
EXIT_STALLED = 75


def overdue(*, started: float | None, hard_limit: float | None, wall_now: float,
            stalled_after: float) -> bool:
    """Whether a task started at ``started`` (wall clock) is past any end it can have: its
    hard limit, or none, and ``stalled_after`` more."""
    if started is None or stalled_after <= 0:
        return False
    return wall_now - started > (hard_limit or 0.0) + stalled_after


class Sightings:
    """How long each queue's next message has been seen there, by this process's monotonic
    clock. A message is known by its whole body (kombu's carries a delivery tag of its own),
    so one sent again is a new message. Not thread-safe: its caller serialises ``waited``."""

    def __init__(self) -> None:
        # queue -> (the message next in it when last looked, when it was first seen there)
        self._first: dict[str, tuple[bytes, float]] = {}

    def waited(self, heads: Mapping[str, bytes | None], now: float) -> float | None:
        """Note ``heads`` - each queue's next message (None: empty), read at ``now`` - and
        return how long the one seen longest has waited; ``None`` when none waits."""
        seen: dict[str, tuple[bytes, float]] = {}
        for queue, raw in heads.items():
            if raw is None:
                continue
            earlier = self._first.get(queue)
            seen[queue] = earlier if earlier is not None and earlier[0] == raw else (raw, now)
        self._first = seen
        return max((now - first for _, first in seen.values()), default=None)


def stalled(*, now: float, last_received: float, running: int, waited: float | None,
            stalled_after: float) -> str | None:
    """Why this worker's consumer looks stalled, or ``None``. All three times are this
    process's monotonic clock: ``now``, when it last received a message, and how long the
    message seen waiting longest in its queues has waited (``Sightings``; ``None``: none
    waits)."""
    if stalled_after <= 0 or running or waited is None:
        return None
    quiet = now - last_received
    if quiet < stalled_after or waited < stalled_after:
        return None
    return (f"a message has waited {waited:.0f} s in this worker's queues and none reached "
            f"it for {quiet:.0f} s while it runs nothing: its consumer stopped")


def end(why: str, grace: float = 30.0) -> None:
    """End this stalled worker: a warm shutdown, which ends at once as nothing that can still
    end is running; past ``grace`` (threads stuck in calls that never return hold a warm
    shutdown for ever) the process exits with ``EXIT_STALLED``. Its unacknowledged messages
    come back through Redis, its keys through the ledger's reaper."""
    log.critical("stalled worker process %d ends itself (its supervisor starts it again): %s",
                 os.getpid(), why)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace)
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - nothing may stop the exit
            pass
    os._exit(EXIT_STALLED)

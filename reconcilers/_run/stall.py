"""When a worker's consumer has stopped consuming without exiting.

Celery's Redis consumer can stop taking messages after its broker connection is reset, with
nothing logged and the process alive (celery/celery#10302, open in the versions this project
pins): the ledger loses nothing - every key stays queued and the reaper keeps re-sending - but
nothing runs until the worker restarts. So the worker's liveness (``/healthz``) reports it,
and its orchestrator restarts it as for any hung process: a worker is stalled when a message
in one of its queues has waited longer than ``RECONCILERS_WORKER_STALLED_AFTER``, it received
none for as long, and it runs nothing now. A busy worker is never called stalled (it takes no
message while its slots are full), nor one that cannot tell (the broker down, a broker that
keeps no list to look into, a message without the ledger's send time): readiness reports an
unreachable broker, and restarting a worker would not bring it back.

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


def stalled(*, now: float, last_received: float, running: int, oldest_sent: float | None,
            wall_now: float, stalled_after: float) -> str | None:
    """Why this worker's consumer looks stalled, or ``None``. ``now``/``last_received`` are
    this process's monotonic clock; ``oldest_sent`` is the ledger's send time (the database's
    wall clock) of the oldest message waiting in the worker's queues, ``wall_now`` this
    host's wall clock."""
    if stalled_after <= 0 or running or oldest_sent is None:
        return None
    quiet = now - last_received
    waited = wall_now - oldest_sent
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

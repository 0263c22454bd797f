"""The periodic tasks - reaper, resync, history pruning, timers - sent by the leading watcher.

The same tasks and intervals as Celery beat's schedule (``schedule``), published by a thread of
the watcher while it leads (through ``broker``, so the watcher runs without Celery): exactly
one sender per installation without a process of its own, since the Lease already elects
exactly one leader. A separate ``celery beat`` still works (``RECONCILERS_WATCHER_SCHEDULES=0``
turns this off); running both only sends each task twice, which they tolerate (each is
idempotent), at some cost.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from reconcilers._base.conf import settings

log = logging.getLogger(__name__)


TIMERS_EVERY = 1.0  # seconds between looks for due timers (``timers``), when any is declared


def schedule(with_timers: bool = False) -> dict[str, dict]:
    """The periodic tasks, in beat's format: name -> {"task", "schedule" (seconds)}; the
    timers' only where a registered reconciler declares one."""
    timers = {"reconcilers-timers": {"task": "reconcilers.timers", "schedule": TIMERS_EVERY}}
    return {
        **(timers if with_timers else {}),
        # The reaper also sends retries whose delay was too long for a broker countdown.
        "reconcilers-reap": {"task": "reconcilers.reap",
                             "schedule": settings().reaper_interval},
        "reconcilers-resync": {"task": "reconcilers.resync", "schedule": 30.0},
        "reconcilers-prune-history": {"task": "reconcilers.prune_history",
                                      "schedule": 3600.0},
    }

# Seconds after leading begins before each task is first sent: the reaper on its own interval,
# the resync and the pruning soon, so a watcher that restarts often still prunes.
FIRST_AFTER = {"reconcilers.prune_history": 60.0}


class Sender(threading.Thread):
    """Send each task of ``schedule`` (beat's format: name -> {"task", "schedule"}) every
    ``schedule`` seconds until ``until()`` says stop."""

    def __init__(self, schedule: dict[str, dict], send: Callable[[str], None],
                 until: Callable[[], bool]):
        super().__init__(name="periodic-tasks", daemon=True)
        self.send, self.until = send, until
        now = time.monotonic()
        self.entries = [(entry["task"], float(entry["schedule"])) for entry in schedule.values()]
        self.due = {task: now + FIRST_AFTER.get(task, every) for task, every in self.entries}

    def run(self) -> None:
        while not self.until():
            now = time.monotonic()
            for task, every in self.entries:
                if now >= self.due[task]:
                    self.due[task] = now + every
                    try:
                        self.send(task)
                    except Exception:  # noqa: BLE001 - a broker outage: the next tick retries
                        log.warning("could not send %s; trying again in %gs", task, every,
                                    exc_info=True)
            time.sleep(max(0.05, min(0.5, min(self.due.values(), default=now + 0.5) - now)))

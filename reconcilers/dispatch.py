"""From ledger to broker: enqueue keys and send their Celery messages after the commit.

The ledger decides *whether* a message is needed; this module sends it. A message that cannot
be sent (broker down) is only logged: the ledger already says "queued", and the reaper sends it
again once ``RECONCILERS_REDISPATCH_AFTER`` has passed, so no key is lost.
"""

from __future__ import annotations

import logging
from typing import Iterable, Sequence

from django.db import transaction

from . import ledger
from .ledger import Dispatch, Key

log = logging.getLogger(__name__)

# Publishing must not stall the watcher for long when Redis is down; the reaper covers it.
PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.5,
                 "interval_max": 1.0}


def task_id(key: Key, token: int) -> str:
    """Derived from the key, so the same dispatch always has the same Celery task id."""
    return f"{key}#{token}"


def send(dispatches: Sequence[Dispatch]) -> int:
    """Publish one message per dispatch; returns how many were handed to the broker."""
    from .registry import registry
    from .tasks import task_for

    sent = 0
    for d in dispatches:
        try:
            cls = registry.get_class(d.key.reconciler) if d.key.reconciler in registry else None
            task_for(d.key.reconciler).apply_async(
                queue=(cls and cls.queue) or None,
                kwargs={"key": str(d.key), "token": d.token},
                task_id=task_id(d.key, d.token),
                countdown=d.countdown or None,
                retry=True, retry_policy=PUBLISH_RETRY,
            )
            sent += 1
        except Exception as exc:  # broker down: the reaper re-sends from the ledger
            log.error("could not send %s (token %s): %s; the reaper will retry",
                      d.key, d.token, exc)
    return sent


def send_on_commit(dispatches: Sequence[Dispatch]) -> None:
    """Send once the surrounding transaction commits (at once in autocommit)."""
    if dispatches:
        transaction.on_commit(lambda: send(dispatches))


def enqueue(keys: Iterable[Key], trigger: str, audit_id: int | None = None) -> int:
    """The single way keys enter the queue (watcher, resync, admin, commands).

    Returns how many keys needed a new message (the rest were already queued or running).
    """
    from . import conf

    dispatches = ledger.enqueue(keys, trigger, audit_id,
                                batch=int(conf.get("RECONCILERS_ENQUEUE_BATCH")))
    send_on_commit(dispatches)
    return len(dispatches)

"""The reaper's pass over the ledger: recover what a crash or a lost message left behind.

Runs whose worker vanished are ended as every run ends (``ledger.finish``, ``lost``, with their
history row); messages that left the broker unclaimed are sent again; retries whose countdown
is not in flight are queued when due. Idempotent; safe to run anywhere (beat runs it).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple

from django.db import DatabaseError, transaction

from reconcilers._base.conf import Backoff
from reconcilers._base.reconcile import Claim, Decision, Dispatch, Key, LeaseLost, Trigger
from reconcilers._queue.cursor import LOCK_ORDER, TABLE, fetch_all, open_cursor
from reconcilers._queue.decision import worker_lost
from reconcilers._queue.ledger import Row, finish

log = logging.getLogger(__name__)


class LostRun(NamedTuple):
    """A run the reaper ended because its worker vanished: its key, the triggers it and the
    events after it had taken up (what its record names), and its key's consecutive
    failures, this one counted."""

    key: Key
    triggers: list[str]
    attempts: int


@dataclass(frozen=True)
class Reaped:
    """What the reaper found: runs whose worker vanished, and messages to (re)send."""

    lost_runs: list[LostRun]  # each ended with its record, by ``finish``
    dispatches: list[Dispatch]


@dataclass(frozen=True)
class Backlog:
    """When the oldest message still waiting in the broker was sent, for each reconciler's
    queue (``other``: every reconciler not named): its ``Dispatch.at``, the database's clock
    in epoch seconds. ``None``: an empty queue, or a message the ledger did not stamp (it
    counts as just sent)."""

    sent: Mapping[str, float | None]
    other: float | None = None


# A lost run's history row, from the run and the decision that ends it (``history``'s).
LostRecord = Callable[[LostRun, Decision], Row]


def reap(redispatch_after: float, backoff: Backoff, backlog: Backlog | None = None,
         record: LostRecord | None = None) -> Reaped:
    """Recover work a crash or a lost message left behind. Idempotent; safe to run anywhere.

    1. running, lease expired: the run's worker died (or was ended at its hard deadline) ->
       ended by ``finish`` as any run ends, ``lost`` (``decision.worker_lost``): backoff, due after
       the key's next backoff, with ``record(run, decision)`` as its history row in the same
       statement - never one without the other. A run whose end fails (the database refused
       its record) is logged and left running, for the next pass to end.
    2. queued, its message sent before the oldest message still waiting in its queue, by more
       than ``redispatch_after``: the queue is first in, first out, so that message has left
       it - to a worker that died, a Redis restart, or a publish that failed - and no run
       claimed it -> send again, once per ``redispatch_after``. A backlog that is merely
       waiting is never multiplied, and nothing else the broker holds (stale messages, beat's
       own, runs in progress) can hide a loss. ``None``: the broker cannot tell; anything
       older than ``redispatch_after`` is sent again. Both times are the database's
       (``dispatched_at``, and the message's ``Dispatch.at``): the hosts that send messages
       and the one that reaps may disagree on the time, by any amount.
    3. backoff, due, with no countdown in flight (long delay) or one long overdue -> queued.

    Each lost run is ended by a statement of its own, which locks its row alone; passes 2 and
    3 lock their rows in key order, as every statement that locks several rows (see
    ``LOCK_ORDER``), and each commits on its own: held together, the passes' locks would not
    be in one order any more, and an enqueue could deadlock with them. Each pass is complete
    alone; what it returns is sent once all three ran.
    """
    backlog = backlog or Backlog({})
    lost_runs = [found.run for found in _expired() if _end_lost(found, backoff, record)]
    with open_cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {TABLE} SET dispatched_at = now()
            WHERE id IN (SELECT id FROM {TABLE}
                         WHERE state = 'queued' AND NOT paused
                           AND (dispatched_at IS NULL
                                OR dispatched_at < least(now(), CASE
                                    WHEN %(sent)s::jsonb ? reconciler
                                    THEN to_timestamp((%(sent)s::jsonb ->> reconciler)::float8)
                                    ELSE to_timestamp(%(other)s::float8) END)
                                    - make_interval(secs => %(after)s))
                         ORDER BY {LOCK_ORDER} FOR UPDATE)
            RETURNING reconciler, namespace, name, token, extract(epoch FROM now())
            """,
            {"after": redispatch_after, "sent": json.dumps(dict(backlog.sent)),
             "other": backlog.other},
        )
        resend = fetch_all(cursor)
        cursor.execute(
            f"""
            UPDATE {TABLE} SET state = 'queued', token = token + 1, due_at = NULL,
                enqueued_at = now(), dispatched_at = now()
            WHERE id IN (SELECT id FROM {TABLE}
                         WHERE state = 'backoff' AND NOT paused AND due_at <= now()
                           AND (dispatched_at IS NULL
                                OR due_at < now() - make_interval(secs => %(after)s))
                         ORDER BY {LOCK_ORDER} FOR UPDATE)
            RETURNING reconciler, namespace, name, token, extract(epoch FROM now())
            """,
            {"after": redispatch_after},
        )
        due = fetch_all(cursor)
    dispatches = [Dispatch(Key(r, ns, n), token, at=float(at))
                  for r, ns, n, token, at in resend + due]
    return Reaped(lost_runs, dispatches)


class _Expired(NamedTuple):
    """A running row whose lease expired: the claim its vanished worker held, that worker,
    and the lost run as the reaper reports and records it."""

    claim: Claim
    worker: str
    run: LostRun


def _expired() -> list[_Expired]:
    """The runs whose lease has expired, in key order. Read without a lock: ``finish`` ends
    each by its token, so one that ended meanwhile (its worker finished after all, or another
    reaper ended it) is left as it is."""
    with open_cursor() as cursor:
        cursor.execute(
            f"""
            SELECT id, reconciler, namespace, name, token, attempts, running_triggers,
                   pending_triggers, running_audit, worker
            FROM {TABLE} WHERE state = 'running' AND lease_expires_at < now()
            ORDER BY {LOCK_ORDER}
            """)
        rows = fetch_all(cursor)
    found = []
    for id_, r, ns, n, token, attempts, running, pending, audit, worker in rows:
        key = Key(r, ns, n)
        found.append(_Expired(
            Claim(id_, key, token, attempts, list(running), list(audit)), worker,
            LostRun(key, [t for t in [*running, *pending] if t != Trigger.RETRY],
                    attempts + 1)))
    return found


def _end_lost(found: _Expired, backoff: Backoff, record: LostRecord | None) -> bool:
    """End one lost run with its record (``finish``, ``lost``); whether it ended here."""
    decision = worker_lost(attempts=found.claim.attempts, backoff=backoff, worker=found.worker)
    row = record(found.run, decision) if record is not None else None
    try:
        with transaction.atomic():  # a savepoint when the caller holds a transaction
            finish(found.claim, decision, 0.0, record=row, lost=True)
    except LeaseLost:
        return False  # it ended meanwhile
    except DatabaseError:
        log.exception("%s: could not end the run its worker lost; the next pass tries again",
                      found.run.key)
        return False
    return True

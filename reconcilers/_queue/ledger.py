"""The work ledger: client-go's WorkQueue contract, made durable in PostgreSQL.

Every transition is one SQL statement on ``reconcilers_workitem``, computed with the database's
clock, so it is atomic across every worker process and host:

- ``enqueue``  idle/backoff -> queued (token+1, a message must be sent); queued: dedup, the
               trigger is merged; running: marked dirty (re-run when it ends). Batched.
- ``claim``    queued (or backoff that is due) -> running, only for the message whose token
               matches: a stale or duplicate message claims nothing and is dropped.
- ``finish``   running -> idle | backoff (retry or requeue-after) | queued (dirty), only with
               the current token; with the run's history row, and with the claim of the key
               its thread runs next, in the same statement. The only way a run ends: by its
               worker, or by the reaper once its lease expired (``lost``).
- ``reap``     recover what a crash or a lost message left behind (beat).

A "dispatch" is (key, token, countdown): a message to send once the transaction commits.
Sending a message twice is harmless - only one can claim. Only ``workqueue`` uses this module:
it pairs each transition with the sending of its messages.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

from django.db import DatabaseError, connection, transaction
from django.db.backends.postgresql.base import ServerBindingCursor

from reconcilers._base.conf import Backoff, settings
from reconcilers._queue.decision import worker_lost
from reconcilers._base.reconcile import (Claim, Decision, Dispatch, Key, LeaseLost, State,
                                         Trigger)
from reconcilers.models import ReconcileRecord, WorkItem

log = logging.getLogger(__name__)

TABLE = WorkItem._meta.db_table
RECORD_TABLE = ReconcileRecord._meta.db_table
RECORD_COLUMNS = tuple(f.column for f in ReconcileRecord._meta.concrete_fields
                       if not f.primary_key)

# Every statement that locks several rows locks them in this order, the key's: two statements
# that took the same rows in two orders (enqueue by key, the reaper by id) could each hold a
# row the other waits for, and PostgreSQL ends one of them with a deadlock error. Byte order
# ("C"), whatever the database's collation: Python's sorted() of keys agrees with it, for
# callers that lock in several statements of one transaction (``manual``).
LOCK_ORDER = 'reconciler COLLATE "C", namespace COLLATE "C", name COLLATE "C"'


class Row(NamedTuple):
    """A run's history record, inserted by the statement that ends the run: every column of
    ``ReconcileRecord`` (``RECORD_COLUMNS``) in one JSON object, which PostgreSQL reads as the
    table's row type - one value bound, not one per column."""

    document: str


class _PreparedCursor(ServerBindingCursor):
    """Server-side binding, each statement prepared on first use: the ledger's few statements
    run for every key, and planning them (CTEs, CASEs) costs PostgreSQL more than running
    them, while client-side binding escapes every value in Python."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        return super().execute(query, params, prepare=True, binary=binary)


_ONLY_WHEN_ASKED = 2**31 - 1  # a prepare threshold no other statement reaches


def _cursor():
    """A cursor for the ledger's statements (``RECONCILERS_PREPARED_STATEMENTS``), wrapped as
    Django wraps its own, so query capture, execute wrappers and error translation apply."""
    if not settings().prepared_statements:
        return connection.cursor()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:  # Django's default turns preparing off altogether;
        raw.prepare_threshold = _ONLY_WHEN_ASKED  # now only the ledger's are prepared
    with connection.wrap_database_errors:
        return connection._prepare_cursor(_PreparedCursor(raw))


def _fetch(cursor) -> list[tuple]:
    return cursor.fetchall() if cursor.description else []


_ENQUEUE_SQL = f"""
WITH input AS (
    SELECT reconciler, namespace, name FROM (
        SELECT DISTINCT reconciler, namespace, name
        FROM unnest(%(reconcilers)s::text[], %(namespaces)s::text[], %(names)s::text[])
            AS t(reconciler, namespace, name)) AS distinct_keys
    ORDER BY {LOCK_ORDER}  -- rows are locked in one order: no deadlocks
)
INSERT INTO {TABLE} AS w (
    reconciler, namespace, name, state, token, dirty, paused, attempts,
    pending_triggers, running_triggers, pending_audit, running_audit,
    enqueued_at, dispatched_at, worker, last_outcome, last_error, created_at)
SELECT reconciler, namespace, name, 'queued', 1, false, false, 0,
       ARRAY[%(trigger)s]::varchar[], '{{}}', %(audit)s::bigint[], '{{}}',
       now(), now(), '', '', '', now()
FROM input
ON CONFLICT (reconciler, namespace, name) DO UPDATE SET
    -- every expression below reads the row as it was before this statement
    pending_triggers = CASE WHEN %(trigger)s = ANY(w.pending_triggers) THEN w.pending_triggers
                            ELSE w.pending_triggers || EXCLUDED.pending_triggers END,
    pending_audit = w.pending_audit || EXCLUDED.pending_audit,
    dirty = w.dirty OR w.state = 'running',
    state = CASE WHEN w.state IN ('idle', 'backoff') AND NOT w.paused THEN 'queued'
                 ELSE w.state END,
    token = CASE WHEN w.state IN ('idle', 'backoff') AND NOT w.paused THEN w.token + 1
                 ELSE w.token END,
    enqueued_at = CASE WHEN w.state IN ('idle', 'backoff') AND NOT w.paused THEN now()
                       ELSE w.enqueued_at END,
    dispatched_at = CASE WHEN w.state IN ('idle', 'backoff') AND NOT w.paused THEN now()
                         ELSE w.dispatched_at END,
    due_at = CASE WHEN w.state IN ('idle', 'backoff') AND NOT w.paused THEN NULL
                  ELSE w.due_at END
-- A row this statement moved to queued has dispatched_at = now() (the transaction's clock).
-- A concurrent enqueue in the same microsecond may also report it: a duplicate message,
-- which the token check in claim() drops.
RETURNING w.reconciler, w.namespace, w.name, w.token, (w.state = 'queued' AND w.dispatched_at = now()),
          extract(epoch FROM now())
"""


def enqueue(keys: Iterable[Key], trigger: str, audit_id: int | None = None,
            batch: int = 1000) -> list[Dispatch]:
    """Add keys to the queue; returns the messages to send once the transaction commits.

    Dedup: a key already queued gets no second message. Exclusion: a running key is only
    marked dirty. A key in backoff is queued at once: a new event does not wait out a retry.
    """
    keys = list(dict.fromkeys(keys))
    dispatches: list[Dispatch] = []
    audit = [audit_id] if audit_id is not None else []
    with _cursor() as cursor:
        for start in range(0, len(keys), batch):
            chunk = keys[start:start + batch]
            cursor.execute(_ENQUEUE_SQL, {
                "reconcilers": [k.reconciler for k in chunk],
                "namespaces": [k.namespace for k in chunk],
                "names": [k.name for k in chunk],
                "trigger": trigger,
                "audit": audit,
            })
            dispatches.extend(
                Dispatch(Key(r, ns, n), token, at=float(at))
                for r, ns, n, token, send, at in _fetch(cursor) if send
            )
    return dispatches


def _claim_sql(only: str = "") -> str:
    """The claim; ``only``: a condition more, ``finish`` locking its rows in order."""
    return f"""
    UPDATE {TABLE} SET
        state = 'running', started_at = now(),
        lease_expires_at = now() + make_interval(secs => %(claim_lease)s),
        worker = %(claim_worker)s,
        running_triggers = pending_triggers, pending_triggers = '{{}}',
        running_audit = pending_audit, pending_audit = '{{}}',
        dirty = false
    WHERE reconciler = %(claim_r)s AND namespace = %(claim_ns)s AND name = %(claim_n)s
      AND token = %(claim_token)s AND NOT paused {only}
      -- a countdown may fire a moment early by the worker's clock: allow 1 s of skew
      AND (state = 'queued'
           OR (state = 'backoff' AND due_at <= now() + interval '1 second'))
    RETURNING id, attempts, running_triggers, running_audit,
        extract(epoch FROM now() - greatest(enqueued_at, coalesce(due_at, enqueued_at)))
    """


_CLAIM_SQL = _claim_sql()

# Ending a run and claiming the next key in one statement locks two rows. Its parts lock
# them in whatever order PostgreSQL runs them, so both first read this CTE, which locks both
# rows in LOCK_ORDER (rows are read from it lazily, in its order, and locked as read).
_LOCK_BOTH = f"""lk AS MATERIALIZED (
    SELECT id FROM {TABLE}
    WHERE id = %(id)s OR (reconciler = %(claim_r)s AND namespace = %(claim_ns)s
                          AND name = %(claim_n)s)
    ORDER BY {LOCK_ORDER} FOR UPDATE)"""
_LOCKED = "AND id IN (SELECT id FROM lk)"


class ClaimRequest(NamedTuple):
    """What claiming a message's key needs: the message ``(key, token)``, who asks, for how
    long."""

    key: Key
    token: int
    worker: str
    lease_seconds: float

    def params(self) -> dict:
        return {"claim_lease": self.lease_seconds, "claim_worker": self.worker,
                "claim_r": self.key.reconciler, "claim_ns": self.key.namespace,
                "claim_n": self.key.name, "claim_token": self.token}

    def claim(self, row: Sequence | None, started: float) -> Claim | None:
        """The run the statement's ``RETURNING`` row (None: nothing matched) stands for."""
        if row is None:
            return None
        return Claim(id=row[0], key=self.key, token=self.token, attempts=row[1],
                     triggers=list(row[2]), audit_ids=list(row[3]),
                     waited=max(0.0, float(row[4] or 0)),
                     held_until=started + self.lease_seconds - 1.0)


def claim(key: Key, token: int, worker: str, lease_seconds: float) -> Claim | None:
    """queued -> running for the message holding ``token``; ``None`` means drop the message.

    The row lock taken by UPDATE serialises concurrent claims: exactly one wins, the others
    see state ``running`` (or a newer token) and match nothing.
    """
    request = ClaimRequest(key, token, worker, lease_seconds)
    started = time.monotonic()
    with _cursor() as cursor:
        cursor.execute(_CLAIM_SQL, request.params())
        row = cursor.fetchone()
    return request.claim(row, started)


class Finished(NamedTuple):
    """How ending a run went: the message to send for its key (``None``: none), the id of
    its history row (0 when none was written) and the run claimed next (``None``: none asked
    for, or that message was stale)."""

    follow_up: Dispatch | None
    record_id: int
    next_claim: Claim | None = None


# Ending a run: the statement every end of a run takes (``finish``), in two texts - with the
# claim of the key its thread runs next, and without. Its parts, data-modifying CTEs (they
# all run to completion, read or not):
#   lk  locks the run's row and the next key's in LOCK_ORDER (with the claim only);
#   f   moves the run's key on, only while the run holds it (its token, state running);
#   r   inserts the run's history row, only if f did (``FROM f``) and a row was given;
#   c   claims the next key (with the claim only).
# Each part returns at most one row; the outer query always returns exactly one, with NULLs
# for a part that matched nothing. Two texts, not one whose claim matches nothing when no key
# waits: the locking CTE and an empty claim would add their work to every end that claims
# nothing, the reaper's and a quiet worker's, for no lock order to keep (one row is locked).
def _end_cte(locked: str) -> str:
    return f"""f AS (
    UPDATE {TABLE} SET
        state = CASE WHEN dirty AND NOT %(lost)s THEN 'queued'
                     WHEN %(delay)s::float8 IS NOT NULL THEN 'backoff'
                     ELSE 'idle' END,
        token = CASE WHEN dirty OR %(delay)s::float8 IS NOT NULL THEN token + 1
                     ELSE token END,
        attempts = %(attempts)s,
        due_at = CASE WHEN dirty AND NOT %(lost)s AND %(debounce)s::float8 > 0
                      THEN now() + make_interval(secs => %(debounce)s::float8)
                      WHEN (NOT dirty OR %(lost)s) AND %(delay)s::float8 IS NOT NULL
                      THEN now() + make_interval(secs => %(delay)s::float8) END,
        enqueued_at = CASE WHEN dirty OR %(lost)s THEN now() ELSE enqueued_at END,
        dispatched_at = CASE
            WHEN %(lost)s THEN NULL
            WHEN dirty THEN now()
            WHEN %(delay)s::float8 IS NOT NULL AND %(delay)s::float8 <= %(max)s THEN now()
            ELSE NULL END,
        -- every expression reads the row as it was: pending_triggers below is the
        -- waiting triggers before the lost run's are put back in front of them
        pending_triggers = CASE WHEN %(lost)s THEN running_triggers ELSE '{{}}' END
            || pending_triggers
            || CASE WHEN %(delay)s::float8 IS NOT NULL
                         AND NOT (%(trig)s = ANY(pending_triggers))
                    THEN ARRAY[%(trig)s]::varchar[] ELSE '{{}}' END,
        pending_audit = CASE WHEN %(lost)s THEN running_audit ELSE '{{}}' END
            || pending_audit,
        running_triggers = '{{}}', running_audit = '{{}}',
        dirty = false, lease_expires_at = NULL, worker = '',
        last_outcome = %(outcome)s, last_error = %(error)s, last_finished_at = now(),
        last_success_at = CASE WHEN %(ok)s THEN now() ELSE last_success_at END
    WHERE id = %(id)s AND token = %(token)s AND state = 'running'
      AND (NOT %(lost)s OR lease_expires_at < now()) {locked}
    RETURNING state, token, dispatched_at IS NOT NULL AS dispatched,
        extract(epoch FROM now()) AS at)"""


_RECORD_CTE = f"""r AS (
    INSERT INTO {RECORD_TABLE} ({", ".join(f'"{c}"' for c in RECORD_COLUMNS)})
    SELECT {", ".join(f'p."{c}"' for c in RECORD_COLUMNS)}
    FROM f, jsonb_populate_record(NULL::{RECORD_TABLE}, %(row)s::jsonb) AS p
    WHERE %(row)s::jsonb IS NOT NULL
    RETURNING id)"""


def _finish_sql(claims_next: bool) -> str:
    if not claims_next:
        return f"""WITH {_end_cte("")}, {_RECORD_CTE}
            SELECT f.state, f.token, f.dispatched, f.at, r.id
            FROM (VALUES (1)) AS one(x) LEFT JOIN (f LEFT JOIN r ON true) ON true"""
    return f"""WITH {_LOCK_BOTH}, {_end_cte(_LOCKED)}, {_RECORD_CTE},
            c AS ({_claim_sql(_LOCKED)})
        SELECT f.state, f.token, f.dispatched, f.at, r.id, c.*
        FROM (VALUES (1)) AS one(x) LEFT JOIN (f LEFT JOIN r ON true) ON true
            LEFT JOIN c ON true"""


_FINISH_SQL = {False: _finish_sql(False), True: _finish_sql(True)}


def finish(claim_: Claim, decision: Decision, max_countdown: float, debounce: float = 0.0,
           record: Row | None = None, then: ClaimRequest | None = None, *,
           lost: bool = False) -> Finished:
    """running -> idle | backoff | queued, in one statement: the only way a run ends - by
    the worker that ran it, or by the reaper when that worker is gone (``lost``).

    ``record``: the run's history row, inserted by the same statement only if the run still
    held its key - a recorded run is a finished run, atomic without a transaction.
    ``then``: the key the same run thread takes up next, claimed by the same statement too
    (client-go's ``Done`` then ``Get`` in one round trip); both or neither happen.

    Raises ``LeaseLost`` when the run no longer holds its key (its lease expired and the reaper
    gave the key to another run): such a run is not a finished run and writes no record - the
    reaper already recorded it as lost. The next key's claim still stands then: it is the
    exception's ``next_claim``, so that key is never left running with nobody running it.

    Dirty wins over everything: an event arrived during the run, so the key runs again - now,
    or after ``debounce`` seconds: it stays queued (events meanwhile are merged into it, as for
    any queued key) and its message carries that countdown. A delay within ``max_countdown``
    is sent as a Celery countdown; a longer one stays in the ledger (``dispatched_at`` NULL)
    until the due sweep sends it.

    ``lost``: the reaper ends a run whose lease expired (its worker died, or was ended at its
    hard deadline; ``reap``), with ``decision.worker_lost``. Only a run whose lease has expired is
    ended so. Backoff wins over dirty: a reconcile that kills its worker every time is retried
    ever more slowly even while events keep coming. What the run had taken up (its triggers and
    audit ids) waits for its retry, as its work was not done; the retry waits in the ledger
    (no message) until the due sweep sends it.
    """
    if then is not None and then.key == claim_.key:
        raise ValueError("a run's own key cannot be claimed by the statement that ends it")
    params = {"delay": decision.delay, "attempts": decision.attempts, "max": max_countdown,
              "trig": decision.trigger or Trigger.RETRY, "outcome": decision.outcome,
              "error": decision.error_message[:4000], "ok": decision.ok, "id": claim_.id,
              "token": claim_.token, "debounce": debounce, "lost": lost,
              "row": record.document if record is not None else None}
    if then is not None:
        params.update(then.params())
    started = time.monotonic()
    with _cursor() as cursor:
        cursor.execute(_FINISH_SQL[then is not None], params)
        row = cursor.fetchone()
    next_claim = None
    if then is not None:
        claimed = row[5:]
        next_claim = then.claim(claimed if claimed[0] is not None else None, started)
    if row[0] is None:
        raise LeaseLost(f"{claim_.key}: the run ended after its lease was lost; the reaper "
                        "re-queued the key", next_claim=next_claim)
    state, token, dispatched, at, record_id = row[:5]
    record_id = record_id or 0
    if state == State.QUEUED:
        return Finished(Dispatch(claim_.key, token, countdown=debounce or None, at=float(at)),
                        record_id, next_claim)
    if state == State.BACKOFF and dispatched:
        return Finished(Dispatch(claim_.key, token, countdown=decision.delay, at=float(at)),
                        record_id, next_claim)
    return Finished(None, record_id, next_claim)


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
    with _cursor() as cursor:
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
        resend = _fetch(cursor)
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
        due = _fetch(cursor)
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
    with _cursor() as cursor:
        cursor.execute(
            f"""
            SELECT id, reconciler, namespace, name, token, attempts, running_triggers,
                   pending_triggers, running_audit, worker
            FROM {TABLE} WHERE state = 'running' AND lease_expires_at < now()
            ORDER BY {LOCK_ORDER}
            """)
        rows = _fetch(cursor)
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


def stats() -> list[tuple[str, str, int, float, float]]:
    """Per reconciler and state: rows, and for running rows the seconds they have run in
    total and the longest (client-go's unfinished work and longest running processor)."""
    with transaction.atomic(), _cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = 2000")  # a scrape must not hang
        cursor.execute(
            f"""
            SELECT reconciler, state, count(*),
                coalesce(sum(extract(epoch FROM now() - started_at))
                         FILTER (WHERE state = 'running'), 0),
                coalesce(max(extract(epoch FROM now() - started_at))
                         FILTER (WHERE state = 'running'), 0)
            FROM {TABLE} GROUP BY reconciler, state ORDER BY reconciler, state
            """
        )
        return [(r, st, n, float(total), float(longest)) for r, st, n, total, longest
                in cursor.fetchall()]


def forget_gone(older_than: float) -> int:
    """Delete the rows of objects that are gone: idle, last run ``gone``, nothing waiting,
    for ``older_than`` seconds. Their history stays; a new object of that name starts a new
    row."""
    with _cursor() as cursor:
        cursor.execute(
            f"""
            DELETE FROM {TABLE} WHERE id IN (
                SELECT id FROM {TABLE}
                WHERE state = 'idle' AND last_outcome = 'gone' AND NOT paused
                  AND cardinality(pending_triggers) = 0
                  AND last_finished_at < now() - make_interval(secs => %s)
                ORDER BY {LOCK_ORDER} FOR UPDATE SKIP LOCKED)
            """,
            [older_than],
        )
        return cursor.rowcount


_FORGET_SQL = f"""
DELETE FROM {TABLE} WHERE id IN (
    SELECT id FROM {TABLE}
    WHERE reconciler = %(reconciler)s AND state <> 'running'
      AND (namespace = ANY(%(namespaces)s::text[])) = %(inside)s
    ORDER BY {LOCK_ORDER} FOR UPDATE)
"""


def forget_in(reconciler: str, namespaces: Iterable[str]) -> int:
    """Delete ``reconciler``'s rows in ``namespaces``, except running ones (whose run ends
    first). Locked in key order before they are deleted, as every statement that locks
    several rows: a plain DELETE takes them in the order it finds them (on disk), and could
    hold one while an enqueue of the same keys held another and waited for it."""
    return _forget(reconciler, namespaces, inside=True)


def forget_outside(reconciler: str, namespaces: Iterable[str]) -> int:
    """Delete ``reconciler``'s rows in every namespace but ``namespaces``, except running
    ones; locked in key order, as ``forget_in``."""
    return _forget(reconciler, namespaces, inside=False)


def _forget(reconciler: str, namespaces: Iterable[str], inside: bool) -> int:
    with _cursor() as cursor:
        cursor.execute(_FORGET_SQL, {"reconciler": reconciler,
                                     "namespaces": sorted(namespaces), "inside": inside})
        return cursor.rowcount


def set_paused(keys: Sequence[Key], paused: bool) -> list[Dispatch]:
    """Pause or resume keys. A paused key is never claimed; resuming sends what waited."""
    if not keys:
        return []
    with _cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {TABLE} AS w SET
                paused = %(paused)s,
                state = CASE WHEN NOT %(paused)s AND w.state = 'idle'
                                  AND cardinality(w.pending_triggers) > 0 THEN 'queued'
                             ELSE w.state END,
                token = CASE WHEN NOT %(paused)s AND w.state IN ('idle', 'queued')
                                  AND (w.state = 'queued' OR cardinality(w.pending_triggers) > 0)
                             THEN w.token + 1 ELSE w.token END,
                dispatched_at = CASE WHEN NOT %(paused)s AND w.state IN ('idle', 'queued')
                                  AND (w.state = 'queued' OR cardinality(w.pending_triggers) > 0)
                             THEN now() ELSE w.dispatched_at END
            WHERE w.id IN (
                SELECT x.id FROM {TABLE} x
                JOIN unnest(%(r)s::text[], %(ns)s::text[], %(n)s::text[]) AS k(r, ns, n)
                  ON x.reconciler = k.r AND x.namespace = k.ns AND x.name = k.n
                WHERE x.paused <> %(paused)s
                ORDER BY {LOCK_ORDER} FOR UPDATE OF x)
            RETURNING w.reconciler, w.namespace, w.name, w.token, w.state, w.dispatched_at = now(),
                extract(epoch FROM now())
            """,
            {"paused": paused, "r": [k.reconciler for k in keys],
             "ns": [k.namespace for k in keys], "n": [k.name for k in keys]},
        )
        rows = _fetch(cursor)
    return [Dispatch(Key(r, ns, n), token, at=float(at))
            for r, ns, n, token, state, send, at in rows if send and state == State.QUEUED]

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

Beside them: ``reaper`` recovers what a crash or a lost message left behind (beat), ending lost
runs through ``finish``; ``upkeep`` pauses, forgets and counts rows; ``cursor`` is how all
three reach PostgreSQL.

A "dispatch" is (key, token, countdown): a message to send once the transaction commits.
Sending a message twice is harmless - only one can claim. Only ``workqueue`` uses the ledger's
modules: it pairs each transition with the sending of its messages.
"""

from __future__ import annotations

import logging
import time
from typing import Iterable, NamedTuple, Sequence

from reconcilers._base.reconcile import (Claim, Decision, Dispatch, Key, LeaseLost, State,
                                         Trigger)
from reconcilers._queue.cursor import LOCK_ORDER, TABLE, fetch_all, open_cursor
from reconcilers.models import ReconcileRecord

log = logging.getLogger(__name__)

RECORD_TABLE = ReconcileRecord._meta.db_table
RECORD_COLUMNS = tuple(f.column for f in ReconcileRecord._meta.concrete_fields
                       if not f.primary_key)


class Row(NamedTuple):
    """A run's history record, inserted by the statement that ends the run: every column of
    ``ReconcileRecord`` (``RECORD_COLUMNS``) in one JSON object, which PostgreSQL reads as the
    table's row type - one value bound, not one per column."""

    document: str


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
    with open_cursor() as cursor:
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
                for r, ns, n, token, send, at in fetch_all(cursor) if send
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
    with open_cursor() as cursor:
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
    with open_cursor() as cursor:
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

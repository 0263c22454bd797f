"""The ledger's rows beside the runs: pausing and resuming keys (staff), forgetting the rows
of gone objects and of namespaces out of scope, and counting rows by state (metrics).

Each statement that locks several rows takes them in ``LOCK_ORDER``, as the run's
transitions do, so none can deadlock with an enqueue.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from django.db import transaction

from reconcilers._base.reconcile import Dispatch, Key, State
from reconcilers._queue.cursor import LOCK_ORDER, TABLE, fetch_all, open_cursor


def stats() -> list[tuple[str, str, int, float, float]]:
    """Per reconciler and state: rows, and for running rows the seconds they have run in
    total and the longest (client-go's unfinished work and longest running processor)."""
    with transaction.atomic(), open_cursor() as cursor:
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
    with open_cursor() as cursor:
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
    with open_cursor() as cursor:
        cursor.execute(_FORGET_SQL, {"reconciler": reconciler,
                                     "namespaces": sorted(namespaces), "inside": inside})
        return cursor.rowcount


def set_paused(keys: Sequence[Key], paused: bool) -> list[Dispatch]:
    """Pause or resume keys. A paused key is never claimed; resuming sends what waited."""
    if not keys:
        return []
    with open_cursor() as cursor:
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
        rows = fetch_all(cursor)
    return [Dispatch(Key(r, ns, n), token, at=float(at))
            for r, ns, n, token, state, send, at in rows if send and state == State.QUEUED]

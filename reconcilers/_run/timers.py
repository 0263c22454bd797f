"""Durable timers: periodic work per object, through the work ledger (kopf's ``@kopf.timer``,
kept in PostgreSQL instead of in a process's memory).

::

    class DatabaseReconciler(Reconciler):
        @timer(interval=300)
        def check_backups(self, obj, ctx):
            ...

Each object of the reconciler has a ``Timer`` row per timer, due every ``interval`` seconds.
The periodic ``reconcilers.timers`` task (every second, from the leading watcher or beat)
moves the due rows on by one interval and enqueues their keys with the trigger
``timer:<name>`` - through the ledger, so a timer never overlaps a reconcile (or another
timer) of its object, and a run that was queued anyway absorbs it. A run whose triggers are
all timers calls those timer methods instead of ``reconcile``; with a change among them it
reconciles and then runs them. History records it with its trigger. A failing timer is
retried with backoff as a timer; ``Result.after`` stays a one-off poll of ``reconcile``.

Rows follow the objects the cache knows (``resync.known_keys``): each look adds the rows of
objects new since the last look of this process and drops those of objects gone, and every
``SYNC_EVERY`` seconds it checks them all. They live in the database, so a restart - of any
process - keeps every object's schedule.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from django.db import connection, transaction

from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base.reconcile import Key

log = logging.getLogger(__name__)

PREFIX = "timer:"
SYNC_EVERY = 30.0  # seconds between reconciling the Timer rows with the known objects
BATCH = 1000  # due rows taken per statement


@dataclass(frozen=True)
class TimerSpec:
    name: str
    interval: float
    initial_delay: float | None = None  # before an object's first firing (default: interval)

    @property
    def trigger(self) -> str:
        return PREFIX + self.name


def timer(interval: float, *, initial_delay: float | None = None) -> Callable:
    """Run the decorated method ``(self, obj, ctx)`` every ``interval`` seconds per object."""
    if not interval > 0:
        raise ValueError(f"a timer's interval must be positive, not {interval!r}")

    def mark(fn: Callable) -> Callable:
        spec = TimerSpec(fn.__name__, float(interval), initial_delay)
        if len(spec.trigger) > 32:  # a trigger is kept in a 32-character column
            raise ValueError(f"timer name {fn.__name__!r} is too long (at most 26 characters)")
        fn.timer_spec = spec  # type: ignore[attr-defined]
        return fn

    return mark


def declared(cls: type[Reconciler]) -> dict[str, TimerSpec]:
    """The timers of a reconciler class, by name (inherited ones included)."""
    out = {}
    for klass in reversed(cls.__mro__):
        for value in vars(klass).values():
            spec = getattr(value, "timer_spec", None)
            if isinstance(spec, TimerSpec):
                out[spec.name] = spec
    return out


def any_declared(reconcilers: Iterable[type[Reconciler]]) -> bool:
    return any(declared(cls) for cls in reconcilers)


def fired(triggers: Iterable[str]) -> list[str]:
    """The timer names among a run's triggers."""
    return sorted({t[len(PREFIX):] for t in triggers if t.startswith(PREFIX)})


def run(reconciler: Reconciler, names: list[str], obj: Any, ctx: Any) -> Any:
    """Call the timers ``names`` of this run; the last one's result decides what follows."""
    result = None
    specs = declared(type(reconciler))
    for name in names:
        if name in specs:  # a timer removed since its key was enqueued is skipped
            result = getattr(reconciler, name)(obj, ctx)
    return result


# Per process: the keys each reconciler's rows were last brought in step with, and when all
# of them were last checked.
_known: dict[str, set[Key]] = {}
_checked_at: dict[str, float] = {}


def fire_due(reconcilers: Iterable[type[Reconciler]]) -> int:
    """The periodic task's work: bring each reconciler's Timer rows in step with the known
    objects, then enqueue the keys whose timers are due."""
    from reconcilers._queue import resync, workqueue

    fired_keys = 0
    for cls in reconcilers:
        specs = declared(cls)
        if not specs:
            continue
        name = cls.name()
        keys = set(resync.known_keys(name))
        before = _known.get(name)
        if before is None or time.monotonic() - _checked_at.get(name, 0.0) >= SYNC_EVERY:
            _sync_rows(name, specs, keys, everything=True)
            _checked_at[name] = time.monotonic()
        elif keys != before:
            _sync_rows(name, specs, keys - before, gone=before - keys)
        _known[name] = keys
        for trigger, due in _take_due(name, specs).items():
            workqueue.add(due, trigger)
            fired_keys += len(due)
    return fired_keys


def _sync_rows(reconciler: str, specs: dict[str, TimerSpec], keys: set[Key],
               gone: set[Key] = frozenset(), everything: bool = False) -> None:
    """A row per (object in ``keys``, timer), new ones due after their initial delay; the
    rows of ``gone`` objects go - or, with ``everything``, those of every object not in
    ``keys`` and of timers no longer declared."""
    from reconcilers.models import Timer

    table = Timer._meta.db_table
    new = sorted(keys)
    with transaction.atomic(), connection.cursor() as cursor:
        for spec in specs.values():
            first = spec.interval if spec.initial_delay is None else spec.initial_delay
            cursor.execute(
                f"""
                INSERT INTO {table} (reconciler, namespace, name, timer, due_at)
                SELECT %s, ns, n, %s, now() + make_interval(secs => %s)
                FROM unnest(%s::text[], %s::text[]) AS k(ns, n)
                ON CONFLICT (reconciler, namespace, name, timer) DO NOTHING
                """,
                [reconciler, spec.name, first, [k.namespace for k in new],
                 [k.name for k in new]])
        if everything:
            cursor.execute(
                f"""
                DELETE FROM {table} t WHERE t.reconciler = %s AND (
                    NOT (t.timer = ANY(%s::text[]))
                    OR NOT EXISTS (SELECT 1 FROM unnest(%s::text[], %s::text[]) AS k(ns, n)
                                   WHERE k.ns = t.namespace AND k.n = t.name))
                """,
                [reconciler, list(specs), [k.namespace for k in new], [k.name for k in new]])
        elif gone:
            cursor.execute(
                f"""
                DELETE FROM {table} t USING unnest(%s::text[], %s::text[]) AS k(ns, n)
                WHERE t.reconciler = %s AND t.namespace = k.ns AND t.name = k.n
                """,
                [[k.namespace for k in gone], [k.name for k in gone], reconciler])


def _take_due(reconciler: str, specs: dict[str, TimerSpec]) -> dict[str, list[Key]]:
    """Move every due row of ``reconciler`` on by its interval (from now: a timer that could
    not fire for a while fires once, not once per missed interval); their keys, by trigger."""
    from reconcilers.models import Timer

    table = Timer._meta.db_table
    out: dict[str, list[Key]] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {table} t SET due_at = now() + make_interval(secs => i.every),
                                 fired_at = now()
            FROM unnest(%s::text[], %s::float8[]) AS i(timer, every)
            WHERE t.timer = i.timer AND t.id IN (
                SELECT id FROM {table} WHERE reconciler = %s AND due_at <= now()
                ORDER BY due_at LIMIT %s FOR UPDATE SKIP LOCKED)
            RETURNING t.namespace, t.name, t.timer
            """,
            [list(specs), [s.interval for s in specs.values()], reconciler, BATCH])
        for namespace, name, timer_name in cursor.fetchall():
            out.setdefault(PREFIX + timer_name, []).append(Key(reconciler, namespace, name))
    return out

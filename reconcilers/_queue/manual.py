"""Manual actions by people (admin, commands): audited, and always through the ledger.

Each action writes one append-only ``AuditLog`` row and passes its id along with the keys, so
the runs it causes carry ``audit_ids`` back to it. Nothing here calls the Kubernetes API: an
admin request only writes to PostgreSQL and publishes Celery messages.
"""

from __future__ import annotations

from typing import Sequence

from django.db import transaction

from reconcilers._queue import workqueue
from reconcilers.models import AuditLog
from reconcilers._base.reconcile import Key, Trigger

MAX_LISTED_KEYS = 1000


def _audit(user, ip: str | None, action: str, reconciler: str, keys: Sequence[Key],
           source: str) -> AuditLog:
    return AuditLog.objects.create(
        user=user if getattr(user, "pk", None) else None,
        username=getattr(user, "username", "") or "system",
        action=action, reconciler=reconciler, keys=[str(k) for k in keys[:MAX_LISTED_KEYS]],
        key_count=len(keys), ip=ip or None, source=source)


def _by_reconciler(keys: Sequence[Key]) -> dict[str, list[Key]]:
    """The keys grouped by reconciler, in reconciler order: an action is one transaction of a
    statement per group, so its groups must come in the ledger's lock order (reconciler
    first) as its rows within a group do - else an enqueue of keys of two of them, taking
    them in that order, could deadlock with it."""
    out: dict[str, list[Key]] = {}
    for k in sorted(keys):
        out.setdefault(k.reconciler, []).append(k)
    return out


def resync(user, keys: Sequence[Key], ip: str | None = None,
           source: str = "admin") -> list[AuditLog]:
    """Enqueue ``keys`` with trigger ``manual``; one audit row per reconciler."""
    rows = []
    with transaction.atomic():
        for reconciler, group in _by_reconciler(keys).items():
            row = _audit(user, ip, AuditLog.Action.RESYNC, reconciler, group, source)
            workqueue.add(group, Trigger.MANUAL, audit_id=row.pk)
            rows.append(row)
    return rows


def set_paused(user, keys: Sequence[Key], paused: bool, ip: str | None = None,
               source: str = "admin") -> list[AuditLog]:
    """Pause (never claimed until resumed) or resume keys; resuming sends what waited."""
    action = AuditLog.Action.PAUSE if paused else AuditLog.Action.RESUME
    rows = []
    with transaction.atomic():
        for reconciler, group in _by_reconciler(keys).items():
            rows.append(_audit(user, ip, action, reconciler, group, source))
            workqueue.pause(group, paused)
    return rows

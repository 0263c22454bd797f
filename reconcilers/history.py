"""Reconcile history: one ``ReconcileRecord`` per run, and its retention."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Mapping

from django.db import connection
from django.utils import timezone

from . import conf
from .ledger import Claim, Key
from .models import Outcome, ReconcileRecord


def record_run(claim: Claim, obj: Mapping | None, *, outcome: str, started: datetime,
               duration: float, requeue_after: float | None = None, error_class: str = "",
               error_message: str = "", traceback: str = "", worker: str = "",
               task_id: str = "", events: list | None = None, final: Mapping | None = None,
               phase: str = "") -> ReconcileRecord:
    """``obj`` is what the run saw; ``final`` the object as it left it (after status writes)."""
    from .capabilities import record_evidence

    meta = (obj or {}).get("metadata") or {}
    status = (final or obj or {}).get("status") or {}
    record = ReconcileRecord.objects.create(
        reconciler=claim.key.reconciler, namespace=claim.key.namespace, name=claim.key.name,
        uid=meta.get("uid", ""), triggers=claim.triggers, attempt=claim.attempts + 1,
        started_at=started, finished_at=started + timedelta(seconds=duration),
        duration_ms=duration * 1000, outcome=outcome, requeue_after=requeue_after,
        error_class=error_class, error_message=error_message, traceback=traceback,
        resource_version=meta.get("resourceVersion", ""), generation=meta.get("generation"),
        worker=worker, task_id=task_id, audit_ids=claim.audit_ids, events=events or [],
        conditions=status.get("conditions") or [] if isinstance(status, Mapping) else [],
        observed_generation=status.get("observedGeneration") if isinstance(status, Mapping)
        else None,
        phase=phase,
    )
    record_evidence(record, claim.attempts)
    return record


def record_lost_runs(lost: list[tuple[Key, list[str], int]]) -> None:
    """A run whose worker died has no record of its own: the reaper writes one."""
    now = timezone.now()
    ReconcileRecord.objects.bulk_create([
        ReconcileRecord(
            reconciler=key.reconciler, namespace=key.namespace, name=key.name,
            triggers=triggers, attempt=attempts, started_at=now, finished_at=now,
            duration_ms=0, outcome=Outcome.ERROR, error_class="WorkerLost",
            error_message="the worker running this key stopped before finishing (lease expired)",
        )
        for key, triggers, attempts in lost
    ])


def for_key(key: Key):
    return ReconcileRecord.objects.filter(
        reconciler=key.reconciler, namespace=key.namespace, name=key.name,
    ).order_by("started_at", "id")


def prune(days: int | None = None, per_key: int | None = None) -> int:
    """Delete records older than ``days`` and beyond the newest ``per_key`` of each key."""
    days = int(conf.get("RECONCILERS_HISTORY_DAYS")) if days is None else days
    per_key = int(conf.get("RECONCILERS_HISTORY_PER_KEY")) if per_key is None else per_key
    deleted = 0
    if days > 0:
        deleted += ReconcileRecord.objects.filter(
            started_at__lt=timezone.now() - timedelta(days=days)).delete()[0]
    if per_key > 0:
        table = ReconcileRecord._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                DELETE FROM {table} WHERE id IN (
                    SELECT id FROM (
                        SELECT id, row_number() OVER (
                            PARTITION BY reconciler, namespace, name
                            ORDER BY started_at DESC, id DESC) AS n
                        FROM {table}) ranked
                    WHERE n > %s)
                """,
                [per_key],
            )
            deleted += cursor.rowcount
    return deleted

"""Reconcile history: one ``ReconcileRecord`` per run, and its retention."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Mapping

from django.db import connection
from django.utils import timezone

from reconcilers._run.evidence import record_evidence
from reconcilers._base.conf import settings
from reconcilers._base.reconcile import Claim, Decision, Key
from reconcilers._queue.workqueue import LostRun, Row
from reconcilers.models import ReconcileRecord, RunInputs


@dataclass(frozen=True)
class RunFacts:
    """What a run saw and did, besides how it ended (the ``Decision``)."""

    started: datetime
    duration: float  # seconds
    worker: str = ""
    task_id: str = ""
    obj: Mapping | None = None  # the object as the run saw it
    final: Mapping | None = None  # the object as the run left it (after status writes)
    events: list = field(default_factory=list)
    phase: str = ""  # reconcile | finalize
    capabilities: list = field(default_factory=list)  # [{"action", "detail"}]


def record_evidence_of(record_id: int, values: Mapping[str, Any], failures_before: int) -> None:
    """The capability evidence of a run whose record ``values`` the ledger wrote as
    ``record_id`` (in the run's transaction)."""
    record_evidence(ReconcileRecord(id=record_id, **values), failures_before)


def new_values(claim: Claim, decision: Decision, facts: RunFacts) -> dict[str, Any]:
    """The run's record as its columns store it: every column, each value of the column's
    type (what ``save()`` would write), a generation that is no integer as none. Built
    without a model instance: this is on every run's path."""
    meta = (facts.obj or {}).get("metadata") or {}
    status = (facts.final or facts.obj or {}).get("status") or {}
    if not isinstance(status, Mapping):
        status = {}
    return {
        "reconciler": claim.key.reconciler, "namespace": claim.key.namespace,
        "name": claim.key.name, "uid": str(meta.get("uid") or ""),
        "triggers": list(claim.triggers), "attempt": claim.attempts + 1,
        "started_at": facts.started,
        "finished_at": facts.started + timedelta(seconds=facts.duration),
        "duration_ms": facts.duration * 1000.0, "outcome": decision.outcome,
        "requeue_after": None if decision.delay is None else float(decision.delay),
        "error_class": decision.error_class, "error_message": decision.error_message,
        "traceback": decision.traceback,
        "resource_version": str(meta.get("resourceVersion") or ""),
        "generation": _integer(meta.get("generation")), "worker": facts.worker,
        "task_id": facts.task_id, "audit_ids": list(claim.audit_ids), "events": facts.events,
        "conditions": status.get("conditions") or [],
        "capabilities": facts.capabilities,
        "observed_generation": _integer(status.get("observedGeneration")),
        "phase": facts.phase,
    }


def _integer(value: Any) -> int | None:
    """A bigint column's value: 3.0 (as some clients write a generation) is 3."""
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def new_record(claim: Claim, decision: Decision, facts: RunFacts) -> ReconcileRecord:
    """The run's record, not saved yet."""
    return ReconcileRecord(**new_values(claim, decision, facts))


_COLUMNS = tuple(f.column for f in ReconcileRecord._meta.concrete_fields if not f.primary_key)


def as_row(values: Mapping[str, Any]) -> Row:
    """``new_values`` as the ledger inserts them with the run's finish: one JSON document of
    every column (PostgreSQL types it by the table's row type), so the statement binds one
    value, not one per column. Datetimes keep their microseconds, as ``save()`` would."""
    document = {c: values[c].isoformat() if isinstance(values[c], datetime) else values[c]
                for c in _COLUMNS}
    return Row(json.dumps(document))


def lost_row(run: LostRun, decision: Decision) -> Row:
    """The record of a run whose worker vanished (``workqueue.reap`` writes it with the run's
    end): no object, no duration, the triggers it and the events after it had taken up."""
    now = timezone.now()
    values = {f.column: f.get_default() for f in ReconcileRecord._meta.concrete_fields}
    values.update(
        reconciler=run.key.reconciler, namespace=run.key.namespace, name=run.key.name,
        triggers=list(run.triggers), attempt=run.attempts, started_at=now, finished_at=now,
        duration_ms=0.0, outcome=decision.outcome, error_class=decision.error_class,
        error_message="the worker running this key stopped before finishing (lease expired)")
    return as_row(values)


def for_key(key: Key):
    return ReconcileRecord.objects.filter(
        reconciler=key.reconciler, namespace=key.namespace, name=key.name,
    ).order_by("started_at", "id")


def prune(days: int | None = None, per_key: int | None = None) -> int:
    """Delete records older than ``days`` and beyond the newest ``per_key`` of each key."""
    days = settings().history_days if days is None else days
    per_key = settings().history_per_key if per_key is None else per_key
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
    with connection.cursor() as cursor:  # the inputs kept for replay go with their runs
        cursor.execute(
            f"""
            DELETE FROM {RunInputs._meta.db_table} i WHERE NOT EXISTS (
                SELECT 1 FROM {ReconcileRecord._meta.db_table} r WHERE r.id = i.record_id)
            """)
    return deleted

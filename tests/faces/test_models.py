"""The models store and query on PostgreSQL (array fields, constraints) as the ledger needs."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from reconcilers.models import ReconcileRecord, WatchStream, WorkItem
from reconcilers._base.reconcile import Outcome, State

pytestmark = pytest.mark.django_db


def test_database_is_postgresql():
    assert connection.vendor == "postgresql"


def test_work_item_round_trips_with_its_trigger_arrays():
    item = WorkItem.objects.create(
        reconciler="foos.samplecontroller.k8s.io", namespace="default", name="example-foo",
        state=State.QUEUED, pending_triggers=["added", "owned-child"],
    )
    loaded = WorkItem.objects.get(pk=item.pk)
    assert loaded.pending_triggers == ["added", "owned-child"]
    assert loaded.state == State.QUEUED
    assert str(loaded) == "foos.samplecontroller.k8s.io:default/example-foo"
    assert WorkItem.objects.filter(pending_triggers__contains=["owned-child"]).count() == 1


def test_one_work_item_per_key():
    key = {"reconciler": "foos.samplecontroller.k8s.io", "namespace": "ns", "name": "a"}
    WorkItem.objects.create(**key)
    with pytest.raises(IntegrityError), transaction.atomic():
        WorkItem.objects.create(**key)


def test_cluster_scoped_key_has_no_namespace_in_its_name():
    item = WorkItem(reconciler="nodes.example.com", name="n1")
    assert str(item) == "nodes.example.com:n1"


def test_reconcile_records_list_newest_first():
    from django.utils import timezone
    from datetime import timedelta

    now = timezone.now()
    for i, outcome in enumerate([Outcome.ERROR, Outcome.SUCCESS]):
        ReconcileRecord.objects.create(
            reconciler="r", namespace="ns", name="a", started_at=now + timedelta(seconds=i),
            finished_at=now + timedelta(seconds=i, milliseconds=5), duration_ms=5,
            outcome=outcome,
        )
    assert [r.outcome for r in ReconcileRecord.objects.all()] == ["success", "error"]


def test_a_streams_status_is_created_once_then_updated_in_place():
    WatchStream.record("foos", "g/v1/foos", connected=True, events=3, role="primary")
    first = WatchStream.objects.get(reconciler="foos", resource="g/v1/foos")
    WatchStream.record("foos", "g/v1/foos", connected=False, events=5, last_error="gone",
                       role="primary")
    WatchStream.record("bars", "g/v1/foos", connected=True, role="owned")
    rows = {(r.reconciler, r.resource): r for r in WatchStream.objects.all()}
    assert len(rows) == 2
    again = rows[("foos", "g/v1/foos")]
    assert (again.pk, again.connected, again.events, again.last_error) == (
        first.pk, False, 5, "gone")
    assert again.updated_at > first.updated_at
    assert rows[("bars", "g/v1/foos")].role == "owned"

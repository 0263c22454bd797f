"""History retention (``_run.history.prune``) on the real PostgreSQL: recent rows stay, and at
most a bounded number per key."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from reconcilers._run import history
from reconcilers.models import ReconcileRecord

pytestmark = pytest.mark.django_db(transaction=True)

PROBE = "probes.test.operator.local"


def test_history_pruning_keeps_recent_rows_and_a_bounded_number_per_key():
    now = timezone.now()

    def rec(name: str, age_days: float) -> None:
        t = now - timedelta(days=age_days)
        ReconcileRecord.objects.create(reconciler=PROBE, namespace="ns", name=name,
                                       started_at=t, finished_at=t, duration_ms=1,
                                       outcome="success")

    rec("old", 30)
    for i in range(5):
        rec("busy", i / 10)
    rec("quiet", 1)
    assert history.prune(days=14, per_key=3) == 3
    assert sorted(ReconcileRecord.objects.values_list("name", flat=True)) == [
        "busy", "busy", "busy", "quiet"]
    newest = ReconcileRecord.objects.filter(name="busy").order_by("-started_at")
    assert newest[0].started_at == now

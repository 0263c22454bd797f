"""Resync (level-triggered safety net). (History retention: tests/run/test_history.py.)"""

from __future__ import annotations

import pytest

from reconcilers._kube import cache
from reconcilers._queue import resync
from reconcilers.models import WorkItem
from reconcilers._authoring.registry import registry

pytestmark = pytest.mark.django_db(transaction=True)

PROBE = "probes.test.operator.local"


def cache_objects(*names: str, ns: str = "ns") -> None:
    gvr = registry.get_class(PROBE).primary()
    cache.put_many(gvr, [{"metadata": {"namespace": ns, "name": n, "resourceVersion": "1"}}
                         for n in names])
    cache.mark_synced(gvr, None, "1")


def test_resync_of_a_kind_enqueues_every_cached_object(redis_client):
    cache_objects("a", "b")
    cache_objects("c", ns="other")
    assert resync.resync(PROBE) == 3
    assert sorted(WorkItem.objects.values_list("name", "pending_triggers")) == [
        ("a", ["manual"]), ("b", ["manual"]), ("c", ["manual"])]
    assert resync.resync(PROBE, namespace="other") == 1


def test_periodic_resync_runs_once_per_period(redis_client, monkeypatch):
    cls = registry.get_class(PROBE)
    monkeypatch.setattr(cls, "resync_period", 60)
    cache_objects("a", "b")
    assert resync.resync_due() == 2
    assert resync.resync_due() == 0  # the period has not passed
    assert all(t == ["resync"] for t in WorkItem.objects.values_list("pending_triggers", flat=True))


def test_secret_data_never_enters_the_cache(redis_client):
    gvr = registry.get_class(PROBE).primary()
    cache.put_many(gvr, [{"kind": "Secret", "metadata": {
        "namespace": "ns", "name": "s", "managedFields": [{"manager": "x"}],
        "annotations": {cache.LAST_APPLIED: "{...}", "keep": "me"}},
        "data": {"password": "aHVudGVyMg=="}, "stringData": {"token": "t"}}])
    stored = cache.get(gvr, "ns", "s")
    assert "data" not in stored and "stringData" not in stored
    assert "managedFields" not in stored["metadata"]
    assert stored["metadata"]["annotations"] == {"keep": "me"}


def test_a_failed_periodic_resync_is_retried_at_the_next_beat(redis_client, monkeypatch):
    from reconcilers._queue import workqueue

    cache_objects("a")
    monkeypatch.setattr(resync, "period_of", lambda name: 600.0 if name == PROBE else 0)

    def database_down(*args, **kwargs):
        raise ConnectionError("the database is down")

    monkeypatch.setattr(workqueue, "add", database_down)
    with pytest.raises(ConnectionError):
        resync.resync_due()
    monkeypatch.undo()
    monkeypatch.setattr(resync, "period_of", lambda name: 600.0 if name == PROBE else 0)
    assert resync.resync_due() == 1  # not a whole period later

"""Predicates on an owned resource, end to end in real watcher and worker processes: a parent
that declares ``Owns(..., predicates=[generation_changed])`` is not reconciled when only its
child's status changes, and one that does not is.

The parents are the test app's ``probes.parent`` and ``probes.statusblind`` (see
``tests/operatorapp/reconcilers.py``): each makes the child ``<name>-child``, a Probe of
``probes.test.operator.local`` - a kind with a status subresource, whose own reconciler is not
running here, so only the test writes the child's status, as the child's controller would."""

from __future__ import annotations

import pytest
from kubernetes import client

from reconcilers.models import ReconcileRecord, WatchStream
from tests.helpers import at_rest, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

VERSION, PLURAL = "v1", "probes"
CHILD_GROUP = "test.operator.local"
CHILD_RESOURCE = f"{CHILD_GROUP}/{VERSION}/{PLURAL}"


def _start(kube, namespace, operator, group: str):
    """The parent ``p`` of ``group`` with its child made and every run of that over: its
    runs so far, and the generations of the child its runs saw (a Redis list)."""
    reconciler = f"{PLURAL}.{group}"
    operator.start_watcher(reconciler)
    operator.start_worker()
    parent = client.CustomObjectsApi(kube).create_namespaced_custom_object(
        group, VERSION, namespace, PLURAL, {"apiVersion": f"{group}/{VERSION}", "kind": "Probe",
                                            "metadata": {"name": "p"}, "spec": {"value": "a"}})
    runs = ReconcileRecord.objects.filter(reconciler=reconciler, namespace=namespace, name="p")
    # The child's creation comes back as an owned-child event: wait for its run, then rest.
    wait_for(lambda: runs.filter(triggers__contains=["owned-child"]).exists(), 60,
             "the parent's run for its child's creation")
    wait_for(lambda: at_rest(reconciler, namespace, "p"), 30, "the parent at rest")
    return runs, f"probe:parent-saw:{parent['metadata']['uid']}"


def _skipped(reconciler: str) -> int:
    row = WatchStream.objects.filter(reconciler=reconciler, resource=CHILD_RESOURCE).first()
    return row.skipped if row else -1


def test_a_childs_status_change_does_not_reconcile_a_parent_whose_owns_filters_it(
        kube, namespace, operator, redis_client):
    reconciler = f"{PLURAL}.statusblind.operator.local"
    runs, saw = _start(kube, namespace, operator, "statusblind.operator.local")
    crd = client.CustomObjectsApi(kube)
    wait_for(lambda: _skipped(reconciler) >= 0, 30, "the child stream's status row")
    skipped, seen, count = _skipped(reconciler), redis_client.llen(saw), runs.count()

    # The child's controller writes its status: the parent's predicate drops the change.
    crd.patch_namespaced_custom_object_status(CHILD_GROUP, VERSION, namespace, PLURAL,
                                              "p-child", {"status": {"value": "busy"}})
    wait_for(lambda: _skipped(reconciler) > skipped, 30,
             "the watcher to count the child's status change as filtered out")
    # A spec change of the child after it, on the same stream: a new generation, which does
    # reconcile the parent. Its run is the only one since the status change.
    crd.patch_namespaced_custom_object(CHILD_GROUP, VERSION, namespace, PLURAL, "p-child",
                                       {"spec": {"note": "changed by hand"}})
    wait_for(lambda: redis_client.lrange(saw, seen, -1) == [b"2"], 60,
             "the parent's run for the child's new generation")
    wait_for(lambda: at_rest(reconciler, namespace, "p"), 30, "the parent at rest")
    assert redis_client.lrange(saw, seen, -1) == [b"2"]
    assert runs.count() == count + 1
    assert runs.latest("id").triggers == ["owned-child"]


def test_without_the_predicate_a_childs_status_change_reconciles_its_parent(
        kube, namespace, operator, redis_client):
    reconciler = f"{PLURAL}.parent.operator.local"
    runs, saw = _start(kube, namespace, operator, "parent.operator.local")
    seen, count = redis_client.llen(saw), runs.count()

    client.CustomObjectsApi(kube).patch_namespaced_custom_object_status(
        CHILD_GROUP, VERSION, namespace, PLURAL, "p-child", {"status": {"value": "busy"}})
    wait_for(lambda: redis_client.lrange(saw, seen, -1) == [b"1"], 60,
             "the parent's run for the child's status change")
    wait_for(lambda: at_rest(reconciler, namespace, "p"), 30, "the parent at rest")
    assert runs.count() == count + 1
    assert runs.latest("id").triggers == ["owned-child"]

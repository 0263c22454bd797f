"""A namespace that leaves the watcher's scope leaves the work queue and the cache's say: its
keys are forgotten rather than retried for ever, and runs there read the api-server."""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from reconcilers._kube import cache
from reconcilers._watch import scopes
from reconcilers.models import ReconcileRecord, WorkItem
from reconcilers._authoring.registry import registry
from tests.e2e.test_engine import PROBE, converged, create
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def second_namespace(kube):
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": name, "labels": {"test": "true"}}})
    yield name
    core.delete_namespace(name)


def test_keys_of_a_namespace_that_left_the_scope_are_forgotten_and_not_read_from_cache(
        kube, namespace, second_namespace, operator):
    kept, left = namespace, second_namespace
    operator.env["RECONCILERS_NAMESPACES"] = f"{kept},{left}"
    operator.start_watcher(PROBE)
    operator.start_worker(concurrency=2, pool="threads")
    create(kube, kept, "a", value=1)
    create(kube, left, "b", value=1)
    create(kube, left, "failing", value=1, failTimes=100000)
    wait_for(lambda: converged(kube, kept, ["a"]) and converged(kube, left, ["b"]), 60)
    wait_for(lambda: ReconcileRecord.objects.filter(name="failing", outcome="error").count() >= 2,
             30, "the failing key retried")
    gvr = registry.get_class(PROBE).primary()
    assert cache.is_synced(gvr, left)

    for proc in operator.watchers:
        proc.stop()
    operator.watchers.clear()
    operator.env["RECONCILERS_NAMESPACES"] = kept
    operator.start_watcher(PROBE)

    # Nobody keeps `left` cached any more: a run there reads the api-server ...
    assert not cache.is_synced(gvr, left)
    assert cache.is_synced(gvr, kept)
    # ... and its keys - the failing one too - leave the ledger instead of retrying for ever.
    wait_for(lambda: not WorkItem.objects.filter(reconciler=PROBE, namespace=left).exists(), 30,
             "the keys of the namespace that left the scope forgotten")
    assert WorkItem.objects.filter(reconciler=PROBE, namespace=kept, name="a").exists()
    assert scopes.covered()[PROBE] == {kept}


def test_a_reconciler_nobody_announces_is_left_alone(redis_client):
    """Its deployment may only be restarting: nothing of it is forgotten."""
    scopes.announce("deployment-a", {"widgets.example.com": ["ns1"]})
    assert scopes.covered() == {"widgets.example.com": {"ns1"}}
    # The same deployment now watches every namespace: nothing of it is dropped ...
    previous = scopes.announce("deployment-a", {"widgets.example.com": None})
    assert scopes.dropped(previous) == {}
    # ... and back to one namespace drops the marker of all of them.
    previous = scopes.announce("deployment-a", {"widgets.example.com": ["ns1"]})
    assert scopes.dropped(previous) == {"widgets.example.com": {None}}
    # Another deployment still covering ns2 keeps its marker.
    scopes.announce("deployment-b", {"widgets.example.com": ["ns2"]})
    previous = scopes.announce("deployment-a", {"widgets.example.com": ["ns3"]})
    assert scopes.dropped(previous) == {"widgets.example.com": {"ns1"}}
    assert scopes.covered() == {"widgets.example.com": {"ns2", "ns3"}}


@pytest.mark.django_db(transaction=True)
def test_a_redis_that_lost_the_scopes_forgets_nothing(redis_client):
    """Two deployments run one reconciler on different namespaces. Redis restarts empty and
    only one of them starts again: the other's keys are not forgotten, since no deployment
    dropped them - only an announced change of a deployment's own scope forgets."""
    from reconcilers._queue import workqueue
    from reconcilers._base.reconcile import Key

    scopes.announce("deployment-a", {"widgets.example.com": ["ns-a"]})
    scopes.announce("deployment-b", {"widgets.example.com": ["ns-b"]})
    workqueue.add([Key("widgets.example.com", "ns-a", "w"), Key("widgets.example.com", "ns-b", "w")],
                  "added")
    redis_client.flushdb()
    previous = scopes.announce("deployment-b", {"widgets.example.com": ["ns-b"]})
    scopes.Forgetting(scopes.dropped(previous))()
    assert WorkItem.objects.filter(reconciler="widgets.example.com").count() == 2

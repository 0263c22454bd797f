"""The PodSet sample's expectations on the real api-server and Redis: a run right after one
that created Pods - before the watch has shown them - waits instead of creating them again."""

from __future__ import annotations

import threading

import pytest
from kubernetes import client

from reconcilers._authoring import crds
from reconcilers._queue import ledger
from reconcilers._run import runner
from reconcilers.models import ReconcileRecord
from reconcilers._watch.reflector import Reflector
from reconcilers._authoring.registry import registry
from reconcilers._base.reconcile import Key
from tests.helpers import REPO

pytestmark = pytest.mark.django_db(transaction=True)

PODSET = "podsets.samples.django-crd-operator.io"
GROUP, VERSION = "samples.django-crd-operator.io", "v1alpha1"


@pytest.fixture
def podset_crd(kube):
    crds.apply_manifest(kube, REPO / "reconcilers" / "contrib" / "podset" / "crds" /
                        f"{PODSET}.yaml")


def _run(namespace: str):
    (d,) = ledger.enqueue([Key(PODSET, namespace, "web")], "manual")
    report = runner.run(str(d.key), d.token)
    return ReconcileRecord.objects.get(pk=report.record_id)


def test_a_run_before_the_cache_shows_the_last_runs_pods_waits_instead_of_creating_more(
        kube, api, namespace, podset_crd, redis_client):
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "podsets", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodSet", "metadata": {"name": "web"},
            "spec": {"replicas": 3, "selector": {"app": "web"},
                     "template": {"labels": {"app": "web"},
                                  "containers": [{"name": "c", "image": "nginx"}]}}})
    # The watcher listed once and then stopped: the Pod cache is synced but will go stale.
    cls = registry.get_class(PODSET)
    for gvr in {g for g in cls.watched().values()}:
        Reflector(gvr, namespace, lambda *a: None, threading.Event()).list(api, initial=True)

    first = _run(namespace)
    assert first.outcome == "success"
    pods = client.CoreV1Api(kube).list_namespaced_pod(namespace).items
    assert len(pods) == 3

    second = _run(namespace)  # the cache still shows no Pods
    assert second.outcome == "requeue_after"
    assert len(client.CoreV1Api(kube).list_namespaced_pod(namespace).items) == 3

    # Once the cache has caught up, the expectations are met and the count is right.
    for gvr in {g for g in cls.watched().values()}:
        Reflector(gvr, namespace, lambda *a: None, threading.Event()).list(api, initial=True)
    third = _run(namespace)
    assert third.outcome == "success"
    assert len(client.CoreV1Api(kube).list_namespaced_pod(namespace).items) == 3

"""The talk's ReplicaSet-like controller, end to end: watcher and workers in their own
processes, Pods scheduled by kube-scheduler to KWOK's simulated nodes. It keeps N Pods through
deletions, scales both ways, adopts orphans, and a burst never over-creates."""

from __future__ import annotations

import threading
import time

import pytest
from kubernetes import client, watch

from tests.helpers import at_rest, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

GROUP, VERSION, PLURAL = "samples.django-crd-operator.io", "v1alpha1", "podsets"
PODSETS = f"{PLURAL}.{GROUP}"
PODSET = f"{PLURAL}.{GROUP}"


def podset(name: str, replicas: int) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PodSet", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"app": name},
                     "template": {"labels": {"app": name},
                                  "containers": [{"name": "web", "image": "nginx"}]}}}


class PodCensus:
    """Watches the namespace's Pods: the most that ever existed at once (not terminating)."""

    def __init__(self, kube, namespace: str):
        self.core, self.namespace = client.CoreV1Api(kube), namespace
        self.alive: set[str] = set()
        self.peak = 0
        self.created = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        w = watch.Watch()
        for event in w.stream(self.core.list_namespaced_pod, self.namespace,
                              timeout_seconds=600):
            pod = event["object"]
            name = pod.metadata.name
            if event["type"] == "ADDED":
                self.created += 1
            if event["type"] == "DELETED" or pod.metadata.deletion_timestamp:
                self.alive.discard(name)
            else:
                self.alive.add(name)
            self.peak = max(self.peak, len(self.alive))
            if self._stop.is_set():
                w.stop()

    def stop(self) -> None:
        self._stop.set()


@pytest.fixture
def podset_operator(operator):
    operator.start_watcher(PODSET)
    operator.start_worker(concurrency=2)
    operator.start_worker()
    return operator


def _status(crd, namespace, name) -> dict:
    return crd.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get(
        "status") or {}


def _running(core, namespace) -> list:
    return [p for p in core.list_namespaced_pod(namespace).items
            if not p.metadata.deletion_timestamp and p.status.phase == "Running"]


def test_a_podset_keeps_its_pods_scales_both_ways_and_adopts_orphans(kube, namespace,
                                                                    podset_operator):
    crd, core = client.CustomObjectsApi(kube), client.CoreV1Api(kube)
    crd.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, podset("web", 3))
    wait_for(lambda: _status(crd, namespace, "web").get("readyReplicas") == 3, 90,
             "three ready Pods")
    status = _status(crd, namespace, "web")
    assert status["replicas"] == 3
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    pods = _running(core, namespace)
    assert len(pods) == 3 and all(p.metadata.owner_references[0].kind == "PodSet" for p in pods)

    # A Pod deleted behind its back is replaced.
    core.delete_namespaced_pod(pods[0].metadata.name, namespace)
    wait_for(lambda: pods[0].metadata.name not in {p.metadata.name for p in _running(
        core, namespace)} and len(_running(core, namespace)) == 3, 90, "a replacement Pod")

    # Scale up, then down.
    crd.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "web",
                                       {"spec": {"replicas": 5}})
    wait_for(lambda: _status(crd, namespace, "web").get("readyReplicas") == 5, 90, "five")
    crd.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "web",
                                       {"spec": {"replicas": 2}})
    wait_for(lambda: len(_running(core, namespace)) == 2
             and _status(crd, namespace, "web").get("replicas") == 2, 90, "two")

    # An orphan that matches is adopted - and, being one too many, one Pod goes.
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": "stray", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}})

    def adopted_and_two_left():
        try:
            stray = core.read_namespaced_pod("stray", namespace)
        except client.ApiException as exc:  # adopted and already deleted as one too many
            if exc.status != 404:
                raise
            stray = None
        adopted = stray is None or any(r.kind == "PodSet" for r in
                                       stray.metadata.owner_references or [])
        return adopted and len([p for p in core.list_namespaced_pod(namespace).items
                                if not p.metadata.deletion_timestamp]) == 2
    wait_for(adopted_and_two_left, 90, "the orphan adopted and the count back to 2")
    events = core.list_namespaced_event(namespace).items
    assert any(e.reason == "Adopted" and "stray" in e.message for e in events)


def test_a_burst_of_scale_changes_never_over_creates(kube, namespace, podset_operator):
    crd = client.CustomObjectsApi(kube)
    census = PodCensus(kube, namespace)
    try:
        crd.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, podset("b", 1))
        wait_for(lambda: _status(crd, namespace, "b").get("readyReplicas") == 1, 90, "one")
        # Twenty quick changes ending at 6; the largest asked for is 8.
        for replicas in [2, 4, 8, 3, 8, 5, 7, 2, 8, 6] * 2:
            crd.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "b",
                                               {"spec": {"replicas": replicas}})
            time.sleep(0.05)
        wait_for(lambda: _status(crd, namespace, "b").get("readyReplicas") == 6
                 and len(census.alive) == 6, 120, "six ready Pods")
        # Nothing more happens afterwards: the last run saw the last change, and none is owed.
        wait_for(lambda: _status(crd, namespace, "b").get("observedGeneration")
                 == crd.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "b")
                 ["metadata"]["generation"] and at_rest(PODSETS, namespace, "b"), 60,
                 "the PodSet's runs over")
        assert len(census.alive) == 6
        assert census.peak <= 8, f"{census.peak} Pods existed at once; at most 8 were asked for"
    finally:
        census.stop()

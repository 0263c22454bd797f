"""sample-controller's Foo, end to end: watcher + Celery worker processes + the real api-server."""

from __future__ import annotations

import pytest
from kubernetes import client

from reconcilers.models import ReconcileRecord
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FOO = "foos.samplecontroller.k8s.io"
GROUP, VERSION, PLURAL = "samplecontroller.k8s.io", "v1alpha1", "foos"


def foo_body(name: str, deployment: str, replicas: int) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Foo", "metadata": {"name": name},
            "spec": {"deploymentName": deployment, "replicas": replicas}}


@pytest.fixture
def foo_operator(operator):
    operator.start_watcher(FOO)
    operator.start_worker()
    operator.start_beat(operator.schedule)
    return operator


def test_foo_creates_an_owned_deployment_follows_replicas_and_mirrors_status(
        kube, namespace, foo_operator):
    crd = client.CustomObjectsApi(kube)
    apps = client.AppsV1Api(kube)
    foo = crd.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                              foo_body("example-foo", "example-foo", 1))

    dep = wait_for(lambda: _deployment(apps, namespace, "example-foo"), 60, "the Deployment")
    (ref,) = dep.metadata.owner_references
    assert (ref.kind, ref.name, ref.uid, ref.controller) == ("Foo", "example-foo",
                                                             foo["metadata"]["uid"], True)
    assert dep.spec.replicas == 1

    def available() -> int | None:
        status = crd.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "example-foo").get("status") or {}
        return status.get("availableReplicas")

    # The Deployment's Pods are scheduled to the simulated nodes and become Ready there, and
    # the Foo mirrors what became available, as upstream's sample shows.
    wait_for(lambda: available() == 1, 90, "availableReplicas to reach 1")
    crd.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "example-foo",
                                       {"spec": {"replicas": 3}})
    wait_for(lambda: apps.read_namespaced_deployment("example-foo", namespace).spec.replicas == 3,
             30, "replicas to follow the Foo")
    wait_for(lambda: available() == 3, 90, "availableReplicas to follow a scale up")
    pods = client.CoreV1Api(kube).list_namespaced_pod(namespace).items
    assert sorted(p.status.phase for p in pods) == ["Running"] * 3
    assert {p.spec.node_name for p in pods} <= {"kwok-node-0", "kwok-node-1"}

    # A Deployment changed behind the operator's back is put back (owned-child trigger).
    apps.patch_namespaced_deployment("example-foo", namespace, {"spec": {"replicas": 7}})
    wait_for(lambda: apps.read_namespaced_deployment("example-foo", namespace).spec.replicas == 3,
             30, "the operator to revert a drifted child")
    assert ReconcileRecord.objects.filter(name="example-foo", triggers__contains=["owned-child"],
                                          outcome="success").exists()

    crd.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "example-foo",
                                       {"spec": {"replicas": 2}})
    wait_for(lambda: available() == 2, 90, "availableReplicas to follow a scale down")

    crd.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "example-foo")
    wait_for(lambda: _deployment(apps, namespace, "example-foo") is None, 60,
             "the garbage collector to delete the owned Deployment")
    wait_for(lambda: ReconcileRecord.objects.filter(name="example-foo", outcome="gone").exists(),
             30, "a 'gone' run after deletion")


def test_foo_refuses_to_adopt_a_deployment_it_does_not_own(kube, namespace, foo_operator):
    apps = client.AppsV1Api(kube)
    labels = {"app": "other"}
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "taken"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
    })
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, foo_body("squatter", "taken", 2))

    def warning_event():
        events = client.CoreV1Api(kube).list_namespaced_event(namespace).items
        return [e for e in events if e.reason == "ErrResourceExists"
                and e.involved_object.name == "squatter"]

    (event,) = wait_for(warning_event, 60, "the ErrResourceExists event")
    assert event.type == "Warning"
    assert event.message == 'Resource "taken" already exists and is not managed by Foo'
    record = wait_for(lambda: ReconcileRecord.objects.filter(name="squatter",
                                                             outcome="error").first(), 30)
    assert record.error_class.endswith("NotOwnedError")
    assert record.events[0]["reason"] == "ErrResourceExists"
    dep = apps.read_namespaced_deployment("taken", namespace)
    assert dep.metadata.owner_references is None and dep.spec.replicas == 1


def _deployment(apps, namespace: str, name: str):
    try:
        return apps.read_namespaced_deployment(name, namespace)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def test_a_foos_deployment_name_cannot_change(kube, namespace, foo_operator):
    """Renaming would orphan the old Deployment: the CRD's CEL rule refuses it."""
    crd = client.CustomObjectsApi(kube)
    crd.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                        foo_body("fixed", "fixed-nginx", 1))
    with pytest.raises(client.ApiException) as err:
        crd.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "fixed",
                                           {"spec": {"deploymentName": "other"}})
    assert err.value.status == 422 and "deploymentName is immutable" in err.value.body

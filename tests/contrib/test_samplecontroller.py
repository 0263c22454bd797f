"""The sample Foo reconciler's unit tests: each run on a fake cluster, in memory - no api-server,
Redis or PostgreSQL (its end-to-end tests, on the real control plane, are in
``tests/e2e/test_sample_operator.py``)."""

from __future__ import annotations

import copy

import pytest

from reconcilers.testing import FakeCluster, reconcile_once

FOO = "foos.samplecontroller.k8s.io"
EXAMPLE = """
apiVersion: samplecontroller.k8s.io/v1alpha1
kind: Foo
metadata:
  name: example-foo
  namespace: default
spec:
  deploymentName: example-web
  replicas: 2
"""


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster.from_yaml(EXAMPLE)


def _deployment(cluster: FakeCluster) -> dict | None:
    return cluster.get("apps/v1", "Deployment", "example-web")


def test_a_foo_gets_a_deployment_it_owns_with_its_replicas(cluster):
    run = reconcile_once(FOO, "default", "example-foo", cluster=cluster)

    assert run.outcome == "success", run.error
    assert [(w.method, w.kind) for w in run.writes] == [("POST", "deployments"),
                                                        ("PATCH", "foos/status")]
    deployment = _deployment(cluster)
    assert deployment["spec"]["replicas"] == 2
    owner = deployment["metadata"]["ownerReferences"][0]
    foo = cluster.get("samplecontroller.k8s.io/v1alpha1", "Foo", "example-foo")
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "Foo", foo["metadata"]["uid"], True)
    assert foo["status"] == {"availableReplicas": 0, "observedGeneration": 1}
    assert [(e["type"], e["reason"], e["object"]) for e in cluster.events()] == [
        ("Normal", "Synced", "Foo/example-foo")]


def test_a_foo_in_step_with_its_deployment_writes_nothing(cluster):
    reconcile_once(FOO, "default", "example-foo", cluster=cluster)
    before = _deployment(cluster)["metadata"]["resourceVersion"]

    again = reconcile_once(FOO, "default", "example-foo", cluster=cluster)

    assert (again.outcome, again.writes) == ("success", [])
    assert _deployment(cluster)["metadata"]["resourceVersion"] == before
    assert cluster.events()[0]["count"] == 2  # the one Event, now a series


def test_a_changed_replica_count_is_patched_into_the_deployment(cluster):
    reconcile_once(FOO, "default", "example-foo", cluster=cluster)
    foo = cluster.get("samplecontroller.k8s.io/v1alpha1", "Foo", "example-foo")
    cluster.request("PATCH", "/apis/samplecontroller.k8s.io/v1alpha1/namespaces/default/foos/"
                    "example-foo", {"spec": {"replicas": 5}},
                    content_type="application/merge-patch+json")

    run = reconcile_once(FOO, "default", "example-foo", cluster=cluster)

    assert run.outcome == "success", run.error
    assert [(w.method, w.kind) for w in run.writes] == [("PATCH", "deployments"),
                                                        ("PATCH", "foos/status")]
    assert _deployment(cluster)["spec"]["replicas"] == 5
    changed = cluster.get("samplecontroller.k8s.io/v1alpha1", "Foo", "example-foo")
    assert changed["metadata"]["generation"] == foo["metadata"]["generation"] + 1
    # The status fields are as they were, but the run saw the new spec: a client waiting for
    # observedGeneration to reach the generation it wrote must see it do so.
    assert changed["status"]["observedGeneration"] == changed["metadata"]["generation"]


def test_the_deployments_available_replicas_are_mirrored_into_the_status():
    cluster = FakeCluster.from_yaml(EXAMPLE, """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: example-web
  namespace: default
  ownerReferences:
  - {apiVersion: samplecontroller.k8s.io/v1alpha1, kind: Foo, name: example-foo,
     controller: true, blockOwnerDeletion: true}
spec:
  replicas: 2
  selector: {matchLabels: {app: nginx, controller: example-foo}}
  template:
    metadata: {labels: {app: nginx, controller: example-foo}}
    spec: {containers: [{name: nginx, image: "nginx:latest"}]}
status:
  availableReplicas: 2
""")

    run = reconcile_once(FOO, "default", "example-foo", cluster=cluster)

    assert run.outcome == "success", run.error
    assert [(w.method, w.kind) for w in run.writes] == [("PATCH", "foos/status")]
    foo = cluster.get("samplecontroller.k8s.io/v1alpha1", "Foo", "example-foo")
    assert foo["status"]["availableReplicas"] == 2


def test_a_deployment_of_that_name_it_does_not_own_is_left_alone_and_warned_about():
    cluster = FakeCluster.from_yaml(EXAMPLE, """
apiVersion: apps/v1
kind: Deployment
metadata: {name: example-web, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: other}}
  template:
    metadata: {labels: {app: other}}
    spec: {containers: [{name: web, image: "httpd:latest"}]}
""")
    before = copy.deepcopy(_deployment(cluster))

    run = reconcile_once(FOO, "default", "example-foo", cluster=cluster)

    assert run.outcome == "error" and run.delay > 0
    assert "already exists and is not managed by Foo" in str(run.error)
    assert run.writes == []
    assert _deployment(cluster) == before
    assert [(e["type"], e["reason"]) for e in cluster.events()] == [
        ("Warning", "ErrResourceExists")]


def test_a_deleted_foo_takes_its_deployment_with_it_and_its_key_is_gone(cluster):
    reconcile_once(FOO, "default", "example-foo", cluster=cluster)

    cluster.delete("samplecontroller.k8s.io/v1alpha1", "Foo", "example-foo")

    assert _deployment(cluster) is None  # the garbage collector's background deletion
    assert reconcile_once(FOO, "default", "example-foo", cluster=cluster).outcome == "gone"

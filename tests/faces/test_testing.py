"""The test kit: one reconcile, in the test's process, against the real api-server."""

from __future__ import annotations

import pytest

from reconcilers.api import PermanentError
from reconcilers.models import ReconcileRecord
from reconcilers.testing import Write, reconcile_once

pytestmark = pytest.mark.django_db(transaction=True)

PROBE = "probes.test.operator.local"


def _probe(kube, namespace: str, name: str, spec: dict) -> None:
    from kubernetes import client

    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        "test.operator.local", "v1", namespace, "probes",
        {"apiVersion": "test.operator.local/v1", "kind": "Probe", "metadata": {"name": name},
         "spec": spec})


def test_one_reconcile_reports_its_outcome_and_every_write(kube, namespace, probe_crds,
                                                           redis_client):
    from kubernetes import client

    _probe(kube, namespace, "ok", {"value": 3})
    run = reconcile_once(PROBE, namespace, "ok")
    assert (run.outcome, run.ok, run.error, run.delay) == ("success", True, None, None)
    assert [(w.method, w.kind) for w in run.writes] == [("PATCH", "probes/status")]
    assert run.writes[0].body["status"]["value"] == 3
    assert run.obj["status"]["value"] == 3
    stored = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        "test.operator.local", "v1", namespace, "probes", "ok")
    assert stored["status"]["value"] == 3  # it really wrote
    assert not ReconcileRecord.objects.exists()  # and recorded nothing: no ledger, no history


def test_failures_come_back_as_a_worker_would_record_them(kube, namespace, probe_crds,
                                                          redis_client):
    _probe(kube, namespace, "broken", {"value": 1, "permanent": True})
    run = reconcile_once(PROBE, namespace, "broken")
    assert run.outcome == "permanent" and isinstance(run.error, PermanentError)
    assert run.writes == [] and not run.ok

    _probe(kube, namespace, "flaky", {"value": 1, "failTimes": 1})
    first = reconcile_once(PROBE, namespace, "flaky")
    assert first.outcome == "error" and first.delay > 0
    assert reconcile_once(PROBE, namespace, "flaky", attempts=1).outcome == "success"

    assert reconcile_once(PROBE, namespace, "never-created").outcome == "gone"


def test_a_write_names_its_resource():
    kinds = [Write("POST", "/apis/apps/v1/namespaces/ns/deployments", {}).kind,
             Write("PATCH", "/apis/apps/v1/namespaces/ns/deployments/web", {}).kind,
             Write("PATCH", "/apis/x.io/v1/namespaces/ns/foos/a/status", {}).kind,
             Write("PUT", "/api/v1/namespaces/ns/configmaps/c", {}).kind,
             Write("PATCH", "/apis/x.io/v1/clusterthings/a/status", {}).kind,
             Write("PATCH", "/api/v1/namespaces/ns", {}).kind]
    assert kinds == ["deployments", "deployments", "foos/status", "configmaps",
                     "clusterthings/status", "namespaces"]


def test_the_readmes_example_the_sample_foo_creates_its_deployment(kube, namespace,
                                                                    redis_client):
    from kubernetes import client

    from tests.helpers import REPO
    from reconcilers._authoring import crds

    crds.apply_manifest(kube, REPO / "reconcilers/contrib/samplecontroller/crds"
                        / "foos.samplecontroller.k8s.io.yaml")
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        "samplecontroller.k8s.io", "v1alpha1", namespace, "foos",
        {"apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
         "metadata": {"name": "example-foo"},
         "spec": {"deploymentName": "example-foo", "replicas": 1}})

    run = reconcile_once("foos.samplecontroller.k8s.io", namespace, "example-foo")
    assert run.outcome == "success", run.error
    assert ("POST", "deployments") in [(w.method, w.kind) for w in run.writes]
    assert run.events[-1]["reason"] == "Synced"
    deployment = client.AppsV1Api(kube).read_namespaced_deployment("example-foo", namespace)
    assert deployment.metadata.owner_references[0].name == "example-foo"

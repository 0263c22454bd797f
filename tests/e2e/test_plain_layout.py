"""The plain layout on a cluster as a new user has it (README, "A first reconciler"):
``manage.py watch`` with the samples (``OPERATOR_SAMPLES=1``, which installs their CRDs) and
one Celery worker - no webhook server. Every kind it installs must stay listable and every
namespace deletable with no other process running: a CRD whose conversion webhook nobody
serves fails every list of its kind, the namespace controller's included, and leaves every
namespace holding one ``Terminating``."""

from __future__ import annotations

import sys
import uuid

import pytest
from kubernetes import client

from reconcilers._kube import kube as door
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

GROUP, PLURAL = "samplecontroller.k8s.io", "foos"
CRD = f"{PLURAL}.{GROUP}"


def _crd_names(kube) -> set[str]:
    return {c.metadata.name for c in
            client.ApiextensionsV1Api(kube).list_custom_resource_definition().items}


def _gone(read) -> bool:
    try:
        read()
    except client.ApiException as exc:
        return exc.status == 404
    return False


@pytest.fixture
def fresh_foo_crd(kube):
    """No Foo CRD, as on a new cluster: the watcher installs it from the sample's manifest."""
    extensions = client.ApiextensionsV1Api(kube)
    if CRD in _crd_names(kube):
        extensions.delete_custom_resource_definition(CRD)
        wait_for(lambda: CRD not in _crd_names(kube), 90, "the Foo CRD to go")


def test_the_plain_layout_serves_foos_and_lets_a_namespace_holding_one_be_deleted(
        kube, fresh_foo_crd, start_process, celery_worker, redis_client):
    env = {"DJANGO_SETTINGS_MODULE": "operator_project.settings", "OPERATOR_SAMPLES": "1",
           "RECONCILERS_LEASE_NAME": f"plain-{uuid.uuid4().hex[:8]}"}
    watcher = start_process("watcher", [sys.executable, "manage.py", "watch"], env)
    watcher.wait_for_log("leading: starting streams", timeout=90)
    celery_worker(env=env)
    wait_for(lambda: CRD in _crd_names(kube), 60, "the watcher to install the Foo CRD")

    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    name = f"t-plain-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"test": "true"}}})
    door.request(kube, "POST", f"/apis/{GROUP}/v1alpha1/namespaces/{name}/{PLURAL}", {
        "apiVersion": f"{GROUP}/v1alpha1", "kind": "Foo", "metadata": {"name": "doomed"},
        "spec": {"deploymentName": "doomed", "replicas": 1}})
    wait_for(lambda: not _gone(lambda: apps.read_namespaced_deployment("doomed", name)), 60,
             "the worker to create the Foo's Deployment")

    # `kubectl get foos -A`: a list through the group's preferred version answers.
    preferred = door.request(kube, "GET", f"/apis/{GROUP}")["preferredVersion"]["groupVersion"]
    listed = door.request(kube, "GET", f"/apis/{preferred}/{PLURAL}")["items"]
    assert ("doomed", name) in {(o["metadata"]["name"], o["metadata"]["namespace"])
                                for o in listed}

    core.delete_namespace(name)
    wait_for(lambda: _gone(lambda: core.read_namespace(name)), 90,
             "the namespace holding a Foo to be deleted")

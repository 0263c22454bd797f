"""Dependent resources end to end, with the Website sample (``reconcilers/contrib/website``):
a watcher and workers in their own processes, Deployments made available by
kube-controller-manager and KWOK's simulated nodes, deletions by its garbage collector.

The Service waits for the Deployment to be available; a Service no longer wanted is deleted;
deleting a Website deletes its children in reverse order, each only once the one depending on
it is gone (the test holds each with a finalizer of its own to see the order), the Deployment's
Pods included; a child of a dependent the class no longer declares is deleted."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from reconcilers._authoring import crds
from reconcilers.models import ReconcileRecord
from tests.helpers import REPO, at_rest, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

GROUP, VERSION, PLURAL = "samples.django-crd-operator.io", "v1alpha1", "websites"
WEBSITES = f"{PLURAL}.{GROUP}"
WEBSITE = f"{PLURAL}.{GROUP}"
HOLD = "test.django-crd-operator.io/hold"


@pytest.fixture(scope="module")
def website_crd(kube):
    crds.apply_manifest(kube, REPO / "reconcilers" / "contrib" / "website" / "crds" /
                        f"{WEBSITE}.yaml")


@pytest.fixture
def website_operator(operator, website_crd):
    # The sample is not among OPERATOR_SAMPLES' apps: its processes load it by name.
    operator.env["OPERATOR_APPS"] = "reconcilers.contrib.website"
    operator.start_watcher(WEBSITE)
    operator.start_worker(concurrency=2)
    return operator


def website(name: str, **spec) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Website", "metadata": {"name": name},
            "spec": {"content": f"<h1>{name}</h1>", **spec}}


def _get(read, *args):
    try:
        return read(*args)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _conditions(crd, namespace, name) -> dict[str, tuple[str, str]]:
    obj = _get(crd.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
    return {c["type"]: (c["status"], c["reason"])
            for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def _hold(patch, name, namespace) -> None:
    patch(name, namespace, {"metadata": {"finalizers": [HOLD]}})


def _release(patch, name, namespace) -> None:
    patch(name, namespace, {"metadata": {"finalizers": None}})


def test_the_service_waits_for_the_deployment_to_be_available(kube, namespace,
                                                              website_operator):
    crd, core, apps = client.CustomObjectsApi(kube), client.CoreV1Api(kube), \
        client.AppsV1Api(kube)
    # No node matches: the Deployment's Pod stays Pending, the Deployment unavailable.
    crd.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, website(
        "site", nodeSelector={"dependents-test/nowhere": "true"}))
    wait_for(lambda: _conditions(crd, namespace, "site").get("ServiceReady")
             == ("False", "Waiting"), 60, "the Service waiting for the Deployment")
    conditions = _conditions(crd, namespace, "site")
    assert conditions["ContentReady"] == ("True", "Ready")
    assert conditions["ServerReady"] == ("False", "NotReady")
    assert conditions["DependentsReady"][0] == "False"
    cm = core.read_namespaced_config_map("site-content", namespace)
    assert cm.data == {"index.html": "<h1>site</h1>"}
    assert cm.metadata.owner_references[0].kind == "Website"
    assert apps.read_namespaced_deployment("site", namespace).spec.template.spec.node_selector
    wait_for(lambda: at_rest(WEBSITES, namespace, "site"), 30, "the Website's runs over")
    assert _get(core.read_namespaced_service, "site", namespace) is None

    # Pods may run anywhere now: once the Deployment is available the Service follows - moved
    # on by the watch of the Deployment (the workflow's safety-net recheck is 60 s away).
    crd.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "site",
                                       {"spec": {"nodeSelector": None}})

    def available():
        d = apps.read_namespaced_deployment("site", namespace)
        return (d.status.available_replicas or 0) == 1 and not d.spec.template.spec.node_selector
    wait_for(available, 90, "the Deployment available")
    seen_available = time.monotonic()
    service = wait_for(lambda: _get(core.read_namespaced_service, "site", namespace), 30,
                       "the Service")
    assert time.monotonic() - seen_available < 20
    assert service.metadata.labels["reconcilers.django-crd-operator.io/dependent"] == "service"
    wait_for(lambda: _conditions(crd, namespace, "site").get("DependentsReady")
             == ("True", "AllReady"), 30, "every dependent ready")
    status = crd.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "site")["status"]
    assert status["url"] == f"http://site.{namespace}.svc"
    assert status["availableReplicas"] == 1
    # In history: the children's changes ran it, never the recheck alone.
    runs = ReconcileRecord.objects.filter(reconciler=WEBSITE, namespace=namespace, name="site")
    assert runs.filter(triggers__contains=["owned-child"]).exists()
    assert not runs.filter(triggers=["requeue"]).exists()


def test_a_service_no_longer_wanted_is_deleted_and_a_website_goes_in_reverse_order(
        kube, namespace, website_operator):
    crd, core, apps = client.CustomObjectsApi(kube), client.CoreV1Api(kube), \
        client.AppsV1Api(kube)
    crd.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, website("web"))
    wait_for(lambda: _get(core.read_namespaced_service, "web", namespace), 90, "the Service")

    # expose: false - the Service goes, the rest stays.
    crd.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "web",
                                       {"spec": {"expose": False}})
    wait_for(lambda: _get(core.read_namespaced_service, "web", namespace) is None, 30,
             "the Service deleted")
    wait_for(lambda: _conditions(crd, namespace, "web").get("ServiceReady")
             == ("False", "NotWanted"), 30, "ServiceReady NotWanted")
    assert apps.read_namespaced_deployment("web", namespace).metadata.deletion_timestamp is None
    assert core.read_namespaced_config_map("web-content", namespace)
    crd.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "web",
                                       {"spec": {"expose": True}})
    wait_for(lambda: _get(core.read_namespaced_service, "web", namespace), 30,
             "the Service back")

    # Each child held by a finalizer of the test's, to see who is deleted when.
    _hold(core.patch_namespaced_service, "web", namespace)
    _hold(apps.patch_namespaced_deployment, "web", namespace)
    crd.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "web")

    def deleting(read, name):
        obj = _get(read, name, namespace)
        return obj is None or obj.metadata.deletion_timestamp is not None

    wait_for(lambda: deleting(core.read_namespaced_service, "web"), 30, "the Service deleted")
    # The Service is still there: nothing it depends on may go, in this run or any owed.
    wait_for(lambda: at_rest(WEBSITES, namespace, "web"), 30, "the Website's runs over")
    assert not deleting(apps.read_namespaced_deployment, "web")
    assert not deleting(core.read_namespaced_config_map, "web-content")

    _release(core.patch_namespaced_service, "web", namespace)
    wait_for(lambda: deleting(apps.read_namespaced_deployment, "web"), 30,
             "the Deployment deleted once the Service is gone")
    wait_for(lambda: at_rest(WEBSITES, namespace, "web"), 30, "the Website's runs over")
    assert not deleting(core.read_namespaced_config_map, "web-content")
    assert _get(crd.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, "web")

    _release(apps.patch_namespaced_deployment, "web", namespace)
    # Foreground deletion of the Deployment: its Pods, which mount the ConfigMap, go first.
    wait_for(lambda: deleting(core.read_namespaced_config_map, "web-content"), 30,
             "the ConfigMap deleted last")
    assert core.list_namespaced_pod(
        namespace, label_selector="app.kubernetes.io/instance=web").items == []
    wait_for(lambda: _get(core.read_namespaced_config_map, "web-content", namespace) is None,
             30, "the ConfigMap gone")
    wait_for(lambda: _get(crd.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                          "web") is None, 30, "the Website gone once its children are")


def test_a_child_of_a_dependent_no_longer_declared_is_deleted(kube, namespace,
                                                              website_operator):
    crd, core = client.CustomObjectsApi(kube), client.CoreV1Api(kube)
    site = crd.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, website(
        "old", expose=False))
    wait_for(lambda: _conditions(crd, namespace, "old").get("DependentsReady")
             == ("True", "AllReady"), 90, "every dependent ready")
    # What an older version of the class made: a ConfigMap of a dependent it has since lost.
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Website", "name": "old",
             "uid": site["metadata"]["uid"], "controller": True}
    core.create_namespaced_config_map(namespace, {"metadata": {
        "name": "old-legacy", "ownerReferences": [owner],
        "labels": {"reconcilers.django-crd-operator.io/dependent": "legacy"}}})
    # Its creation reconciles its owner (an owned kind), which deletes it.
    wait_for(lambda: _get(core.read_namespaced_config_map, "old-legacy", namespace) is None,
             30, "the undeclared dependent's child deleted")
    assert core.read_namespaced_config_map("old-content", namespace)

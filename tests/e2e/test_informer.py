"""The informer's other inputs, end to end in real watcher and worker processes: a related
object (``Watches``) reconciles the object that uses it, and an index read with ``ctx.list``
follows the cluster."""

from __future__ import annotations

import pytest
from kubernetes import client

from reconcilers.models import ReconcileRecord
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

GROUP, VERSION, PLURAL = "configured.operator.local", "v1", "probes"
CONFIGURED = f"{PLURAL}.{GROUP}"


def _status(kube, namespace: str, name: str) -> dict:
    obj = client.CustomObjectsApi(kube).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name)
    return obj.get("status") or {}


def test_a_referenced_config_map_change_reconciles_its_user(kube, namespace, operator):
    core = client.CoreV1Api(kube)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "p1-config"},
                                                  "data": {"value": "a", "color": "red"}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "unrelated"},
                                                  "data": {"color": "red"}})
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, {"apiVersion": f"{GROUP}/{VERSION}",
                                            "kind": "Probe", "metadata": {"name": "p1"},
                                            "spec": {}})
    operator.start_watcher(CONFIGURED)
    operator.start_worker()
    wait_for(lambda: _status(kube, namespace, "p1").get("value") == "a", 60, "first value")
    assert _status(kube, namespace, "p1")["sameColor"] == 2  # from the index in the cache

    # Only the ConfigMap changes - the Probe's spec does not - and the Probe follows.
    core.patch_namespaced_config_map("p1-config", namespace, {"data": {"value": "b",
                                                                       "color": "blue"}})
    wait_for(lambda: _status(kube, namespace, "p1") == {"value": "b", "sameColor": 1,
                                                        "observedGeneration": 1},
             60, "the Probe to follow its ConfigMap")
    run = ReconcileRecord.objects.filter(reconciler=CONFIGURED, name="p1").latest("id")
    assert "watched" in run.triggers

    # A ConfigMap nobody uses reconciles nothing.
    runs = ReconcileRecord.objects.filter(reconciler=CONFIGURED).count()
    core.patch_namespaced_config_map("unrelated", namespace, {"data": {"color": "green"}})
    core.delete_namespaced_config_map("p1-config", namespace)
    wait_for(lambda: _status(kube, namespace, "p1").get("value") is None, 60,
             "the Probe to see its ConfigMap go")
    assert ReconcileRecord.objects.filter(reconciler=CONFIGURED).count() == runs + 1

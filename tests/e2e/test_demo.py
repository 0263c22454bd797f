"""`make demo` starts every role, serves the admin, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import signal
import socket
import sys
import urllib.request

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_demo_runs_the_sample_operator_serves_the_admin_and_stops_on_ctrl_c(start_process, kube):
    from kubernetes import client

    from tests.helpers import wait_for

    port, webhook_port = _free_port(), _free_port()
    demo = start_process("demo", [sys.executable, "-m", "operator_project.demo"],
                         env={"OPERATOR_DEMO_PORT": str(port),
                              "OPERATOR_DEMO_WEBHOOK_PORT": str(webhook_port)})
    demo.wait_for_log("Login:      admin / ", timeout=90)
    demo.wait_for_log("celery@", timeout=60)
    demo.wait_for_log(f"Starting development server at http://127.0.0.1:{port}/", timeout=60)

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=10) as resp:
        assert resp.status == 200
        assert b"csrfmiddlewaretoken" in resp.read()

    demo.wait_for_log("foo.samplecontroller.k8s.io/example-foo", timeout=90)
    apps = client.AppsV1Api(kube)

    def owned_deployment():
        try:
            dep = apps.read_namespaced_deployment("example-foo", "default")
        except client.ApiException:
            return None
        return [r.kind for r in dep.metadata.owner_references or []] == ["Foo"]

    foos = client.CustomObjectsApi(kube)

    def available() -> int | None:
        foo = foos.get_namespaced_custom_object("samplecontroller.k8s.io", "v1alpha1",
                                                "default", "foos", "example-foo")
        return (foo.get("status") or {}).get("availableReplicas")

    try:
        wait_for(owned_deployment, 60, "the sample Foo's Deployment")
        # What the demo prints: scale the Foo and its status follows the real Pods.
        wait_for(lambda: available() == 1, 90, "availableReplicas 1")
        foos.patch_namespaced_custom_object("samplecontroller.k8s.io", "v1alpha1", "default",
                                            "foos", "example-foo", {"spec": {"replicas": 3}})
        wait_for(lambda: available() == 3, 90, "availableReplicas to follow replicas")

        # The webhooks the demo serves and registers: a Foo without replicas gets 1, a second
        # Foo naming the example's Deployment is refused with the first one's name.
        def create(name: str, deployment: str, dry_run: bool = True) -> dict:
            return foos.create_namespaced_custom_object(
                "samplecontroller.k8s.io", "v1alpha1", "default", "foos",
                {"apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
                 "metadata": {"name": name}, "spec": {"deploymentName": deployment}},
                dry_run="All" if dry_run else None)
        wait_for(lambda: create("defaulted", "defaulted")["spec"].get("replicas") == 1, 60,
                 "the demo's mutating webhook")
        with pytest.raises(client.ApiException) as denied:
            create("rival", "example-foo")
        assert 'already named by Foo "example-foo"' in json.loads(denied.value.body)["message"]

    finally:
        client.CustomObjectsApi(kube).delete_namespaced_custom_object(
            "samplecontroller.k8s.io", "v1alpha1", "default", "foos", "example-foo")

    demo.popen.send_signal(signal.SIGINT)
    assert demo.popen.wait(timeout=40) == 0
    assert "demo: stopped" in demo.log()
    # Stopped, the demo leaves no webhook behind to judge the stack's writes.
    names = {c.metadata.name for c in client.AdmissionregistrationV1Api(kube)
             .list_validating_webhook_configuration().items}
    assert "django-crd-operator-validate" not in names
    # The sample converts through nothing: `kubectl get foos` answers with the demo stopped.
    crd = client.ApiextensionsV1Api(kube).read_custom_resource_definition(
        "foos.samplecontroller.k8s.io")
    assert crd.spec.conversion.strategy == "None"

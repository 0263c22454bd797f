"""The local control plane behaves like a real cluster where operators depend on it."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid

import pytest
from kubernetes import client, watch

from tests.helpers import REPO

pytestmark = pytest.mark.e2e


def _pinned_kubernetes_version() -> str:
    for line in (REPO / "reconcilers" / "devstack" / "versions.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1]
    raise AssertionError("KUBERNETES_VERSION not pinned in reconcilers/devstack/versions.env")


def _wait(predicate, timeout: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def widget_crd(kube):
    """A namespaced CRD with a validated spec, removed after the test."""
    ext = client.ApiextensionsV1Api(kube)
    group = f"t{uuid.uuid4().hex[:8]}.example.com"
    name = f"widgets.{group}"
    ext.create_custom_resource_definition({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "properties": {"size": {"type": "integer", "minimum": 1}},
                        },
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    },
                }},
            }],
        },
    })

    def established():
        crd = ext.read_custom_resource_definition(name)
        return any(c.type == "Established" and c.status == "True"
                   for c in (crd.status.conditions or []))

    _wait(established, what="CRD Established")
    yield group
    ext.delete_custom_resource_definition(name)


def test_version_endpoint_reports_the_pinned_release(kube):
    info = client.VersionApi(kube).get_code()
    assert info.git_version == _pinned_kubernetes_version()


def test_kubectl_accepts_the_generated_kubeconfig(stack):
    bins = os.environ.get("OPERATOR_CONTROL_PLANE_BIN")
    assert bins, "make up writes OPERATOR_CONTROL_PLANE_BIN into .local/env"
    out = subprocess.run(
        [f"{bins}/kubectl", "get", "namespace", "default", "-o", "name"],
        env={**os.environ, "KUBECONFIG": str(stack.kubeconfig)},
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "namespace/default"


def test_requests_without_credentials_are_rejected(stack):
    """Authentication is real: an anonymous request cannot list namespaces."""
    cfg = client.Configuration()
    cfg.host = f"https://127.0.0.1:{stack.apiserver_port}"
    cfg.ssl_ca_cert = str(stack.pki_dir / "ca.crt")
    with client.ApiClient(cfg) as anonymous:
        with pytest.raises(client.ApiException) as err:
            client.CoreV1Api(anonymous).list_namespace()
    assert err.value.status in (401, 403)


def test_crd_schema_validation_rejects_an_invalid_object_with_422(kube, namespace, widget_crd):
    api = client.CustomObjectsApi(kube)
    ok = api.create_namespaced_custom_object(widget_crd, "v1", namespace, "widgets", {
        "apiVersion": f"{widget_crd}/v1", "kind": "Widget",
        "metadata": {"name": "good"}, "spec": {"size": 3},
    })
    assert ok["spec"]["size"] == 3

    with pytest.raises(client.ApiException) as err:
        api.create_namespaced_custom_object(widget_crd, "v1", namespace, "widgets", {
            "apiVersion": f"{widget_crd}/v1", "kind": "Widget",
            "metadata": {"name": "bad"}, "spec": {"size": 0},
        })
    assert err.value.status == 422
    assert "spec.size" in err.value.body


def test_watch_sees_added_modified_and_deleted(kube, namespace, widget_crd):
    api = client.CustomObjectsApi(kube)
    listing = api.list_namespaced_custom_object(widget_crd, "v1", namespace, "widgets")
    rv = listing["metadata"]["resourceVersion"]
    seen: list[tuple[str, str]] = []
    w = watch.Watch()

    def consume():
        for event in w.stream(api.list_namespaced_custom_object, widget_crd, "v1", namespace,
                              "widgets", resource_version=rv, timeout_seconds=30):
            seen.append((event["type"], event["object"]["metadata"]["name"]))
            if event["type"] == "DELETED":
                w.stop()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    body = {"apiVersion": f"{widget_crd}/v1", "kind": "Widget",
            "metadata": {"name": "w1"}, "spec": {"size": 1}}
    api.create_namespaced_custom_object(widget_crd, "v1", namespace, "widgets", body)
    api.patch_namespaced_custom_object(widget_crd, "v1", namespace, "widgets", "w1",
                                       {"spec": {"size": 2}})
    api.delete_namespaced_custom_object(widget_crd, "v1", namespace, "widgets", "w1")
    t.join(30)
    assert seen == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]


def test_garbage_collector_deletes_owned_objects_with_their_owner(kube, namespace):
    core = client.CoreV1Api(kube)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(namespace, {"metadata": {
        "name": "child",
        "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
            "uid": owner.metadata.uid, "controller": True, "blockOwnerDeletion": True,
        }],
    }})
    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    def child_gone():
        try:
            core.read_namespaced_config_map("child", namespace)
        except client.ApiException as e:
            return e.status == 404
        return False

    _wait(child_gone, timeout=60, what="garbage collection of the owned ConfigMap")


def test_devstack_run_gives_a_command_the_running_stack(stack):
    """`python -m reconcilers.devstack run CMD` (the test kit's other door) leaves a running
    stack alone and hands CMD its connection settings, options after the command included."""
    out = subprocess.run(
        ["python3", "-m", "reconcilers.devstack", "run", "sh", "-c",
         'echo "$KUBECONFIG $DATABASE_URL $REDIS_URL"', "--purge"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == [str(stack.kubeconfig), stack.database_url, stack.redis_url]
    status = subprocess.run(["python3", "-m", "reconcilers.devstack", "status"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stdout


def test_deployments_get_pods_that_are_scheduled_to_simulated_nodes_and_become_ready(
        kube, namespace):
    """kube-controller-manager's default controllers, kube-scheduler and KWOK: what a user's
    cluster does with a Deployment, without containers."""
    apps = client.AppsV1Api(kube)
    labels = {"app": "web"}
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}})
    _wait(lambda: (apps.read_namespaced_deployment("web", namespace).status
                   .available_replicas or 0) == 2, 90, "two available replicas")
    (rs,) = apps.list_namespaced_replica_set(namespace).items
    assert rs.metadata.owner_references[0].name == "web"
    pods = client.CoreV1Api(kube).list_namespaced_pod(namespace).items
    assert len(pods) == 2
    for pod in pods:
        assert pod.status.phase == "Running" and pod.spec.node_name.startswith("kwok-node-")
        assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"


def test_postgres_starts_over_locks_whose_pid_another_process_holds(stack):
    """A reset that killed the stack leaves ``postmaster.pid`` and the socket's lock file;
    PostgreSQL refuses to start while any process holds the number in them, so ``make up``
    must see through a reused one."""
    import signal

    from django.db import connections

    from reconcilers.devstack import services

    connections.close_all()
    data = services.pg_data_dir(stack)
    locks = [data / "postmaster.pid", data / f".s.PGSQL.{stack.postgres_port}.lock"]
    postmaster = int(locks[0].read_text().split()[0])
    os.killpg(services.read_pid(stack.run_dir / "postgres.pid"), signal.SIGKILL)
    _wait(lambda: not os.path.exists(f"/proc/{postmaster}"), 30, "the postmaster reaped")
    # PostgreSQL ignores a pid it may not signal, so the bystander runs as PostgreSQL's user.
    bystander = subprocess.Popen(["sleep", "600"], user=services._pg_user())
    try:
        for lock in locks:
            lines = lock.read_text().splitlines()
            lock.write_text("\n".join([str(bystander.pid), *lines[1:]]) + "\n")
        services.start_postgres(stack)
        assert services._psql(stack, "select 1") == "1"
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        if not services.port_open(stack.postgres_port):
            for lock in locks:
                lock.unlink(missing_ok=True)
            services.start_postgres(stack)

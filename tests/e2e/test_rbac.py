"""The operator runs as a ServiceAccount bound to the generated least-privilege ClusterRole."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from kubernetes import client

from reconcilers import rbac
from reconcilers.registry import registry
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FOO = "foos.samplecontroller.k8s.io"


@pytest.fixture
def service_account_kubeconfig(kube, namespace, stack, tmp_path, settings):
    """A ServiceAccount with the generated ClusterRole, and a kubeconfig holding its token."""
    settings.RECONCILERS_LEASE_NAME = f"watcher-{namespace}"
    rbac_api = client.RbacAuthorizationV1Api(kube)
    core = client.CoreV1Api(kube)
    name = f"operator-{namespace}"
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "operator"}})
    role = rbac.cluster_role([registry.get_class(FOO)], name)
    rbac_api.create_cluster_role(role)
    rbac_api.create_cluster_role_binding(rbac.cluster_role_binding(name, "operator", namespace))
    token = core.create_namespaced_service_account_token(
        "operator", namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "local", "cluster": {
            "server": f"https://127.0.0.1:{stack.apiserver_port}",
            "certificate-authority": str(stack.pki_dir / "ca.crt")}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa"}}]}))
    yield path, role
    rbac_api.delete_cluster_role_binding(name)
    rbac_api.delete_cluster_role(name)


def test_the_generated_role_has_no_wildcards_and_no_secrets(kube, namespace, stack,
                                                             service_account_kubeconfig):
    _, role = service_account_kubeconfig
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert "secrets" not in rule["resources"]
    kubectl = os.path.join(os.environ["OPERATOR_CONTROL_PLANE_BIN"], "kubectl")
    out = subprocess.run(
        [kubectl, "auth", "can-i", "--list", "-n", namespace,
         f"--as=system:serviceaccount:{namespace}:operator"],
        env={**os.environ, "KUBECONFIG": str(stack.kubeconfig)},
        capture_output=True, text=True, timeout=30, check=True).stdout
    lines = out.splitlines()[1:]
    assert any(line.startswith("foos.samplecontroller.k8s.io ") for line in lines), out
    for line in lines:
        resource, *_rest = line.split()
        verbs = line[line.index("["):] if "[" in line else ""
        assert not resource.startswith("*") and "[*]" not in verbs, line
        assert not resource.startswith("secrets"), line


def test_the_sample_operator_works_with_only_the_generated_role(
        kube, namespace, operator, service_account_kubeconfig):
    kubeconfig, _ = service_account_kubeconfig
    operator.env.update({"KUBECONFIG": str(kubeconfig),
                         "RECONCILERS_LEASE_NAMESPACE": namespace})
    operator.start_watcher(FOO)
    operator.start_worker()
    foos = client.CustomObjectsApi(kube)
    apps = client.AppsV1Api(kube)
    foos.create_namespaced_custom_object("samplecontroller.k8s.io", "v1alpha1", namespace, "foos", {
        "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
        "metadata": {"name": "rbac-foo"}, "spec": {"deploymentName": "rbac-foo", "replicas": 2}})

    def deployment():
        try:
            return apps.read_namespaced_deployment("rbac-foo", namespace)
        except client.ApiException:
            return None

    dep = wait_for(deployment, 60, "the Deployment, created with the ServiceAccount's rights")
    assert dep.metadata.owner_references[0].kind == "Foo"
    wait_for(lambda: "status" in foos.get_namespaced_custom_object(
        "samplecontroller.k8s.io", "v1alpha1", namespace, "foos", "rbac-foo"), 30, "status")
    wait_for(lambda: any(e.reason == "Synced" for e in
                         client.CoreV1Api(kube).list_namespaced_event(namespace).items), 30,
             "the Synced event")
    foos.delete_namespaced_custom_object("samplecontroller.k8s.io", "v1alpha1", namespace,
                                         "foos", "rbac-foo")
    wait_for(lambda: deployment() is None, 60, "garbage collection")
    for proc in operator.watchers + operator.workers:
        # ApiError's text is "403 Forbidden: ..."; a bare "403" also matches timings and
        # resourceVersions, which grew enough to contain it once the cluster ran Pods.
        assert "Forbidden" not in proc.log(), proc.log()[-3000:]

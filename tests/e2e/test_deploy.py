"""The in-cluster manifests (deploy/, kustomize) render, are accepted by a real api-server, and
stay in sync with what the code generates (RBAC, the sample's CRD)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from kubernetes import client

from tests.helpers import REPO

pytestmark = pytest.mark.e2e

KUBECTL = os.path.join(os.environ.get("OPERATOR_CONTROL_PLANE_BIN", ""), "kubectl")


def test_committed_rbac_is_what_the_rbac_command_generates():
    out = subprocess.run(
        [sys.executable, "manage.py", "rbac", "--service-account", "django-crd-operator",
         "--namespace", "django-crd-operator"], cwd=REPO, capture_output=True, text=True,
        check=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "operator_project.settings",
             "OPERATOR_SAMPLES": "0"}).stdout
    assert out == (REPO / "deploy" / "rbac.yaml").read_text(), \
        "deploy/rbac.yaml is stale: regenerate it with `manage.py rbac --service-account ...`"


def test_kustomization_renders_and_the_api_server_accepts_it(kube, stack):
    env = {**os.environ, "KUBECONFIG": str(stack.kubeconfig)}
    rendered = subprocess.run([KUBECTL, "kustomize", str(REPO / "deploy")], env=env,
                              capture_output=True, text=True, check=True, timeout=60).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered) if d)
    assert kinds == sorted(["Namespace", "ServiceAccount", "ServiceAccount", "ClusterRole",
                            "ClusterRoleBinding", "ConfigMap", "Job", "Deployment", "Service",
                            "Deployment", "Deployment", "Deployment", "Service", "Service"])
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered) if d}
    assert docs[("ConfigMap", "django-crd-operator")]["data"]["OPERATOR_SAMPLES"] == "0"
    role = docs[("ClusterRole", "django-crd-operator")]
    assert not any("customresourcedefinitions" in r.get("resources", []) for r in role["rules"])
    pods = {name: d["spec"]["template"]["spec"] for (kind, name), d in docs.items()
            if kind in ("Deployment", "Job")}
    # Only the watcher and the workers act on the cluster; web, beat and migrate cannot.
    assert {n for n, p in pods.items() if p["serviceAccountName"] == "django-crd-operator"} == {
        "django-crd-operator-watcher", "django-crd-operator-worker"}
    assert pods["django-crd-operator-migrate"]["automountServiceAccountToken"] is False
    assert pods["django-crd-operator-beat"]["automountServiceAccountToken"] is False
    try:
        subprocess.run([KUBECTL, "apply", "--server-side", "--force-conflicts",
                        "--field-manager", "test-deploy", "-k", str(REPO / "deploy")], env=env,
                       capture_output=True, text=True, check=True, timeout=120)
        apps = client.AppsV1Api(kube)
        names = {d.metadata.name for d in
                 apps.list_namespaced_deployment("django-crd-operator").items}
        assert names == {f"django-crd-operator-{r}" for r in ("web", "watcher", "worker",
                                                              "beat")}
        worker = apps.read_namespaced_deployment("django-crd-operator-worker",
                                                 "django-crd-operator")
        assert worker.spec.template.spec.service_account_name == "django-crd-operator"
        assert worker.spec.template.spec.security_context.run_as_non_root is True
    finally:
        rbac = client.RbacAuthorizationV1Api(kube)
        for delete in (lambda: client.CoreV1Api(kube).delete_namespace("django-crd-operator"),
                       lambda: rbac.delete_cluster_role_binding("django-crd-operator"),
                       lambda: rbac.delete_cluster_role("django-crd-operator")):
            try:
                delete()
            except client.ApiException as e:
                if e.status != 404:
                    raise


def test_every_pod_is_probed_over_http_and_its_metrics_port_is_discoverable():
    rendered = subprocess.run([KUBECTL, "kustomize", str(REPO / "deploy")],
                              capture_output=True, text=True, check=True, timeout=60).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    services = [d for d in docs if d["kind"] == "Service"]
    for role in ("watcher", "worker", "web"):
        pod = deployments[f"django-crd-operator-{role}"]["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        port = "http" if role == "web" else "metrics"
        assert port in {p["name"] for p in container["ports"]}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
        # A Service selects the pod and names the port, as the ServiceMonitor expects.
        assert any(s["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
                   and port in {p["name"] for p in s["spec"]["ports"]}
                   and s["metadata"]["labels"]["app.kubernetes.io/name"] == "django-crd-operator"
                   for s in services), role
    # beat serves nothing (one short-lived publisher); only its own process knows it is alive.
    assert "livenessProbe" not in deployments["django-crd-operator-beat"]["spec"]["template"][
        "spec"]["containers"][0]

    monitoring = subprocess.run([KUBECTL, "kustomize", str(REPO / "deploy" / "monitoring")],
                                capture_output=True, text=True, check=True, timeout=60).stdout
    kinds = {d["kind"]: d for d in yaml.safe_load_all(monitoring) if d}
    assert {e["port"] for e in kinds["ServiceMonitor"]["spec"]["endpoints"]} == {"metrics",
                                                                                 "http"}
    dashboard = json.loads(kinds["ConfigMap"]["data"]["grafana-dashboard.json"])
    assert dashboard["uid"] == "django-crd-operator"

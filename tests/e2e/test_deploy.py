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
                            "Deployment", "Deployment", "Service", "Service"])
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered) if d}
    assert docs[("ConfigMap", "django-crd-operator")]["data"]["OPERATOR_SAMPLES"] == "0"
    role = docs[("ClusterRole", "django-crd-operator")]
    assert not any("customresourcedefinitions" in r.get("resources", []) for r in role["rules"])
    pods = {name: d["spec"]["template"]["spec"] for (kind, name), d in docs.items()
            if kind in ("Deployment", "Job")}
    # Only the watcher and the workers act on the cluster; web and migrate cannot.
    assert {n for n, p in pods.items() if p["serviceAccountName"] == "django-crd-operator"} == {
        "django-crd-operator-watcher", "django-crd-operator-worker"}
    assert pods["django-crd-operator-migrate"]["automountServiceAccountToken"] is False
    # The default layout: the leading watcher sends the periodic tasks (no beat), the workers
    # run reconciles in a thread pool.
    assert "django-crd-operator-beat" not in pods
    assert docs[("ConfigMap", "django-crd-operator")]["data"].get(
        "RECONCILERS_WATCHER_SCHEDULES", "1") not in ("0", "off", "false")
    (worker,) = pods["django-crd-operator-worker"]["containers"]
    assert "--pool threads" in worker["command"][-1]
    try:
        subprocess.run([KUBECTL, "apply", "--server-side", "--force-conflicts",
                        "--field-manager", "test-deploy", "-k", str(REPO / "deploy")], env=env,
                       capture_output=True, text=True, check=True, timeout=120)
        apps = client.AppsV1Api(kube)
        names = {d.metadata.name for d in
                 apps.list_namespaced_deployment("django-crd-operator").items}
        assert names == {f"django-crd-operator-{r}" for r in ("web", "watcher", "worker")}
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
    # The optional beat (large installs) serves nothing; only its own process knows it lives.
    beat = yaml.safe_load((REPO / "deploy" / "beat.yaml").read_text())
    assert "livenessProbe" not in beat["spec"]["template"]["spec"]["containers"][0]
    assert beat["spec"]["template"]["spec"]["automountServiceAccountToken"] is False

    monitoring = subprocess.run([KUBECTL, "kustomize", str(REPO / "deploy" / "monitoring")],
                                capture_output=True, text=True, check=True, timeout=60).stdout
    kinds = {d["kind"]: d for d in yaml.safe_load_all(monitoring) if d}
    assert {e["port"] for e in kinds["ServiceMonitor"]["spec"]["endpoints"]} == {"metrics",
                                                                                 "http"}
    dashboard = json.loads(kinds["ConfigMap"]["data"]["grafana-dashboard.json"])
    assert dashboard["uid"] == "django-crd-operator"


def test_committed_webhook_manifests_are_what_the_command_generates():
    out = subprocess.run(
        [sys.executable, "manage.py", "webhook", "manifests"], cwd=REPO, capture_output=True,
        text=True, check=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "operator_project.settings",
             "OPERATOR_SAMPLES": "1"}).stdout
    assert out == (REPO / "deploy" / "webhook" / "generated.yaml").read_text(), \
        "deploy/webhook/generated.yaml is stale: regenerate it with `manage.py makecrds`"


def test_makecrds_keeps_and_checks_the_webhook_manifests_with_the_crds(tmp_path):
    """A hook added to a resource changes the configurations and the server's RBAC: the same
    `makecrds --check` that catches a stale CRD in CI catches a stale webhook file."""
    target = tmp_path / "generated.yaml"
    committed = (REPO / "deploy" / "webhook" / "generated.yaml").read_text()
    target.write_text(committed.replace("- get\n", "", 1))

    def makecrds(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "manage.py", "makecrds", *args], cwd=REPO, capture_output=True,
            text=True, timeout=60,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "operator_project.settings",
                 "OPERATOR_SAMPLES": "1", "RECONCILERS_WEBHOOK_MANIFESTS": str(target)})

    stale = makecrds("--check")
    assert stale.returncode == 1 and "stale: " in stale.stderr
    assert str(target.name) in stale.stderr
    assert target.read_text() != committed  # --check writes nothing
    assert makecrds().returncode == 0
    assert target.read_text() == committed
    fresh = makecrds("--check")
    assert fresh.returncode == 0 and "up to date" in fresh.stdout, fresh.stderr


def test_webhook_manifests_fit_together_and_the_api_server_accepts_them(kube, stack,
                                                                      namespace):
    """deploy/webhook-cert-manager: the configurations call the Service the server sits behind,
    the server mounts the Secret the Certificate writes, the CA is injected from that
    Certificate, the server may only read the hooked kinds - and the api-server takes it all."""
    from reconcilers.contrib.samplecontroller.resources import Foo

    test_ns = namespace
    env = {**os.environ, "KUBECONFIG": str(stack.kubeconfig)}
    rendered = subprocess.run([KUBECTL, "kustomize", str(REPO / "deploy" / "webhook-cert-manager")],
                              env=env, capture_output=True, text=True, check=True,
                              timeout=60).stdout
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered) if d}
    name = "django-crd-operator-webhook"
    service, deployment = docs[("Service", name)], docs[("Deployment", name)]
    certificate = docs[("Certificate", name)]
    namespace = service["metadata"]["namespace"]
    (port,) = service["spec"]["ports"]
    assert Foo._meta.webhook_service == (namespace, name, port["port"])
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    tls = next(v for v in pod["spec"]["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == certificate["spec"]["secretName"]
    assert f"{name}.{namespace}.svc" in certificate["spec"]["dnsNames"]
    for kind, hook in (("ValidatingWebhookConfiguration", "validate"),
                       ("MutatingWebhookConfiguration", "mutate")):
        config = docs[(kind, f"django-crd-operator-{hook}")]
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
            f"{namespace}/{certificate['metadata']['name']}"
        (webhook,) = config["webhooks"]
        assert webhook["clientConfig"]["service"] == {
            "namespace": namespace, "name": name, "port": port["port"], "path": f"/{hook}"}
        assert webhook["sideEffects"] == "None" and webhook["failurePolicy"] == "Fail"
    assert pod["spec"]["serviceAccountName"] == name
    role = docs[("ClusterRole", name)]
    assert role["rules"] == [{"apiGroups": ["samplecontroller.k8s.io"], "resources": ["foos"],
                              "verbs": ["get", "list"]}]
    binding = docs[("ClusterRoleBinding", name)]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name,
                                    "namespace": namespace}]

    # Everything but cert-manager's own kinds (no cert-manager here), in this test's namespace,
    # validated by the api-server without being stored: registered for real, the
    # configurations would call a server that is not running for every Foo write of the
    # other tests.
    plain = subprocess.run([KUBECTL, "kustomize", str(REPO / "deploy" / "webhook")], env=env,
                           capture_output=True, text=True, check=True, timeout=60).stdout
    out = subprocess.run([KUBECTL, "apply", "--dry-run=server", "-f", "-"], env=env,
                         input=plain.replace(f"namespace: {namespace}", f"namespace: {test_ns}"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "validatingwebhookconfiguration.admissionregistration.k8s.io/" \
           "django-crd-operator-validate created (server dry run)" in out.stdout
    assert f"deployment.apps/{name} created (server dry run)" in out.stdout

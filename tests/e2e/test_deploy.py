"""The in-cluster manifests (deploy/, kustomize) render, are accepted by a real api-server, and
stay in sync with what the code generates (RBAC, the sample's CRD); the production surface
(docs/running/cluster.md): confined pods, disruption budgets, network policies, pinned images and a
migration Job that upgrades without being deleted by hand."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tomllib

import pytest
import yaml
from kubernetes import client

from tests.helpers import REPO, wait_for

pytestmark = pytest.mark.e2e

KUBECTL = os.path.join(os.environ.get("OPERATOR_CONTROL_PLANE_BIN", ""), "kubectl")
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = "django-crd-operator"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}


def _render(directory: str = "deploy") -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(REPO / directory)], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _pod_specs(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("Deployment", "Job")}


def _release(docs: list[dict], version: str) -> list[dict]:
    """deploy/ as the release of ``version`` has it: its image tag, and the migrate Job named
    for it (a Job's template is immutable, so each version brings a Job of its own)."""
    docs = copy.deepcopy(docs)
    for doc in docs:
        if doc["kind"] == "Job" and doc["metadata"]["name"].startswith(f"{IMAGE}-migrate"):
            doc["metadata"]["name"] = f"{IMAGE}-migrate-v{version.replace('.', '-')}"
        if doc["kind"] in ("Deployment", "Job"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container["image"].split(":")[0] == IMAGE:
                    container["image"] = f"{IMAGE}:{version}"
    return docs


def _into(docs: list[dict], namespace: str) -> list[dict]:
    """The namespaced objects of ``docs``, moved to ``namespace`` (a test's own)."""
    moved = [copy.deepcopy(d) for d in docs if d["kind"] not in CLUSTER_SCOPED]
    for doc in moved:
        doc["metadata"]["namespace"] = namespace
    return moved


def _apply(stack, docs: list[dict], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [KUBECTL, "apply", "--server-side", "--force-conflicts", "--field-manager", "test-deploy",
         *args, "-f", "-"], input=yaml.safe_dump_all(docs), capture_output=True, text=True,
        timeout=120, env={**os.environ, "KUBECONFIG": str(stack.kubeconfig)})


def test_committed_rbac_is_what_the_rbac_command_generates():
    out = subprocess.run(
        [sys.executable, "manage.py", "rbac", "--service-account", "django-crd-operator",
         "--namespace", "django-crd-operator"], cwd=REPO, capture_output=True, text=True,
        check=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "operator_project.settings",
             "OPERATOR_SAMPLES": "0", "RECONCILERS_METRICS_SECURE": "1"}).stdout
    assert out == (REPO / "deploy" / "rbac.yaml").read_text(), \
        "deploy/rbac.yaml is stale: regenerate it with `manage.py rbac --service-account ...`"
    # The deployment's settings ask the api-server who may read /metrics: the role lets it.
    config = yaml.safe_load((REPO / "deploy" / "config.yaml").read_text())["data"]
    assert config["RECONCILERS_METRICS_SECURE"] == "1"


def test_kustomization_renders_and_the_api_server_accepts_it(kube, stack):
    env = {**os.environ, "KUBECONFIG": str(stack.kubeconfig)}
    rendered = subprocess.run([KUBECTL, "kustomize", str(REPO / "deploy")], env=env,
                              capture_output=True, text=True, check=True, timeout=60).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered) if d)
    assert kinds == sorted(["Namespace", "ServiceAccount", "ServiceAccount", "ClusterRole",
                            "ClusterRoleBinding", "ConfigMap", "Job", "Deployment", "Service",
                            "Deployment", "Deployment", "Service", "Service",
                            *["PodDisruptionBudget"] * 3, *["NetworkPolicy"] * 4])
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered) if d}
    assert docs[("ConfigMap", "django-crd-operator")]["data"]["OPERATOR_SAMPLES"] == "0"
    role = docs[("ClusterRole", "django-crd-operator")]
    assert not any("customresourcedefinitions" in r.get("resources", []) for r in role["rules"])
    pods = {name: d["spec"]["template"]["spec"] for (kind, name), d in docs.items()
            if kind in ("Deployment", "Job")}
    # Only the watcher and the workers act on the cluster; web and migrate cannot.
    assert {n for n, p in pods.items() if p["serviceAccountName"] == "django-crd-operator"} == {
        "django-crd-operator-watcher", "django-crd-operator-worker"}
    assert pods[f"django-crd-operator-migrate-v{VERSION.replace('.', '-')}"][
        "automountServiceAccountToken"] is False
    # The default layout: the leading watcher sends the periodic tasks (no beat), the workers
    # run reconciles in a thread pool.
    assert "django-crd-operator-beat" not in pods
    assert docs[("ConfigMap", "django-crd-operator")]["data"].get(
        "RECONCILERS_WATCHER_SCHEDULES", "1") not in ("0", "off", "false")
    (worker,) = pods["django-crd-operator-worker"]["containers"]
    assert "--pool threads" in worker["command"][-1]
    try:
        applied = subprocess.run([KUBECTL, "apply", "--server-side", "--force-conflicts",
                                  "--field-manager", "test-deploy", "-k", str(REPO / "deploy")],
                                 env=env, capture_output=True, text=True, timeout=120)
        assert applied.returncode == 0, applied.stderr
        # The namespace warns of any pod below Pod Security's `restricted`: none is.
        assert "PodSecurity" not in applied.stderr, applied.stderr
        apps = client.AppsV1Api(kube)
        names = {d.metadata.name for d in
                 apps.list_namespaced_deployment("django-crd-operator").items}
        assert names == {f"django-crd-operator-{r}" for r in ("web", "watcher", "worker")}
        worker = apps.read_namespaced_deployment("django-crd-operator-worker",
                                                 "django-crd-operator")
        assert worker.spec.template.spec.service_account_name == "django-crd-operator"
        assert worker.spec.template.spec.security_context.run_as_non_root is True
        policy = client.PolicyV1Api(kube)
        assert {p.metadata.name for p in policy.list_namespaced_pod_disruption_budget(
            "django-crd-operator").items} == {
            f"django-crd-operator-{r}" for r in ("web", "watcher", "worker")}
        assert len(client.NetworkingV1Api(kube).list_namespaced_network_policy(
            "django-crd-operator").items) == 4
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
    """The kubelet probes each pod over plain HTTP; the watcher's and the workers' /metrics
    are on a port of their own, HTTPS with a bearer token, as the ServiceMonitor scrapes."""
    rendered = subprocess.run([KUBECTL, "kustomize", str(REPO / "deploy")],
                              capture_output=True, text=True, check=True, timeout=60).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    services = [d for d in docs if d["kind"] == "Service"]
    env = yaml.safe_load((REPO / "deploy" / "config.yaml").read_text())["data"]
    for role, setting in (("watcher", "WATCHER"), ("worker", "WORKER"), ("web", "")):
        pod = deployments[f"django-crd-operator-{role}"]["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        probe, metrics = ("http", "http") if role == "web" else ("probes", "metrics")
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert {probe, metrics} <= ports.keys()
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": probe}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": probe}
        if setting:  # the ports the process serves them on, by its settings' defaults
            defaults = {"WATCHER": (8081, 8443), "WORKER": (8082, 8444)}[setting]
            assert (ports[probe], ports[metrics]) == defaults
            assert env["RECONCILERS_METRICS_SECURE"] == "1"
        # A Service selects the pod and names the port, as the ServiceMonitor expects.
        assert any(s["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
                   and metrics in {p["name"] for p in s["spec"]["ports"]}
                   and s["metadata"]["labels"]["app.kubernetes.io/name"] == "django-crd-operator"
                   for s in services), role
    # The optional beat (large installs) serves nothing; only its own process knows it lives.
    beat = yaml.safe_load((REPO / "deploy" / "beat.yaml").read_text())
    assert "livenessProbe" not in beat["spec"]["template"]["spec"]["containers"][0]
    assert beat["spec"]["template"]["spec"]["automountServiceAccountToken"] is False

    monitoring = subprocess.run([KUBECTL, "kustomize", str(REPO / "deploy" / "monitoring")],
                                capture_output=True, text=True, check=True, timeout=60).stdout
    kinds = {d["kind"]: d for d in yaml.safe_load_all(monitoring) if d}
    endpoints = {e["port"]: e for e in kinds["ServiceMonitor"]["spec"]["endpoints"]}
    assert endpoints.keys() == {"metrics", "http"}
    assert endpoints["metrics"]["scheme"] == "https"
    assert endpoints["metrics"]["bearerTokenFile"].endswith("serviceaccount/token")
    # Prometheus's ServiceAccount may `get` /metrics, which the secure port asks for.
    assert kinds["ClusterRole"]["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert kinds["ClusterRoleBinding"]["roleRef"]["name"] == kinds["ClusterRole"]["metadata"][
        "name"]
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


def test_every_pod_runs_confined_as_the_images_user():
    """seccomp RuntimeDefault, non-root as the Dockerfile's USER, no privilege escalation, no
    capabilities, a read-only root: Pod Security's `restricted`, for every pod deploy/ runs and
    the optional beat."""
    dockerfile = (REPO / "Dockerfile").read_text()
    (user,) = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    uid, gid = (int(n) for n in user.split(":"))
    pods = _pod_specs(_render())
    pods["beat"] = yaml.safe_load((REPO / "deploy" / "beat.yaml").read_text())["spec"][
        "template"]["spec"]
    assert len(pods) == 5
    for name, pod in pods.items():
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": uid,
                                          "runAsGroup": gid,
                                          "seccompProfile": {"type": "RuntimeDefault"}}, name
        for container in pod["containers"] + pod.get("initContainers", []):
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]}}, name
    namespace = next(d for d in _render() if d["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/warn"] == "restricted"


def test_images_are_the_release_and_the_migrate_job_is_named_for_it():
    """No `:latest` and no untagged image: the tag is pyproject.toml's version, set once in
    kustomization.yaml's `images:`, and the migrate Job carries the same version in its name
    and goes away a while after it finished."""
    docs = _render()
    images = [c["image"] for pod in _pod_specs(docs).values() for c in pod["containers"]]
    assert images and set(images) == {f"{IMAGE}:{VERSION}"}
    kustomization = yaml.safe_load((REPO / "deploy" / "kustomization.yaml").read_text())
    assert kustomization["images"] == [{"name": IMAGE, "newTag": VERSION}]
    assert _release(docs, VERSION) == docs, "deploy/ is not the release of pyproject's version"
    (job,) = [d for d in docs if d["kind"] == "Job"]
    assert 0 < job["spec"]["ttlSecondsAfterFinished"] <= 7 * 86400


def test_the_next_release_applies_over_this_one(stack, kube, namespace):
    """deploy/ of this version, then of the next, applied for real: the next migrate Job is a
    Job of its own beside the finished one, and the Deployments roll to the new tag. The same
    upgrade with the Job's name unchanged fails on its immutable template - what used to need
    a `kubectl delete job` by hand."""
    major, minor, _ = VERSION.split(".")
    after = f"{major}.{int(minor) + 1}.0"
    this = _into(_render(), namespace)
    applied = _apply(stack, this)
    assert applied.returncode == 0, applied.stderr
    upgraded = _apply(stack, _release(this, after))
    assert upgraded.returncode == 0, upgraded.stderr
    jobs = client.BatchV1Api(kube).list_namespaced_job(namespace).items
    assert {j.metadata.name for j in jobs} == {
        f"{IMAGE}-migrate-v{v.replace('.', '-')}" for v in (VERSION, after)}
    web = client.AppsV1Api(kube).read_namespaced_deployment(f"{IMAGE}-web", namespace)
    assert web.spec.template.spec.containers[0].image == f"{IMAGE}:{after}"

    unnamed = _release(this, "99.0.0")
    for doc in unnamed:
        if doc["kind"] == "Job":
            doc["metadata"]["name"] = f"{IMAGE}-migrate-v{VERSION.replace('.', '-')}"
    refused = _apply(stack, [d for d in unnamed if d["kind"] == "Job"])
    assert refused.returncode != 0 and "field is immutable" in refused.stderr, refused.stderr


def test_disruption_budgets_take_one_pod_at_a_time_and_never_block_a_drain(stack, kube,
                                                                             namespace):
    """Each Deployment has one budget that lets a pod go (maxUnavailable 1, never minAvailable
    = replicas); on the api-server the watcher's two pods allow one eviction, and the single
    web pod may be evicted."""
    docs = _render()
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        (budget,) = [b for b in budgets
                     if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        replicas = deployment["spec"]["replicas"]
        spec = budget["spec"]
        assert spec.get("maxUnavailable", 0) >= 1 or spec["minAvailable"] < replicas
        if replicas > 1:  # ... and never all of them at once
            assert spec.get("maxUnavailable", 1) < replicas
        assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"

    applied = _apply(stack, [d for d in _into(docs, namespace)
                             if d["kind"] in ("Deployment", "PodDisruptionBudget")])
    assert applied.returncode == 0, applied.stderr
    policy = client.PolicyV1Api(kube)

    def allowed(role: str) -> int | None:
        status = policy.read_namespaced_pod_disruption_budget(f"{IMAGE}-{role}",
                                                              namespace).status
        if status and status.current_healthy == status.expected_pods > 0:
            return status.disruptions_allowed
        return None

    assert wait_for(lambda: allowed("watcher"), 90, "the watcher's pods ready") == 1
    assert wait_for(lambda: allowed("web"), 90, "the web pod ready") == 1
    core = client.CoreV1Api(kube)
    (pod,) = core.list_namespaced_pod(
        namespace, label_selector="app.kubernetes.io/component=web").items
    core.create_namespaced_pod_eviction(pod.metadata.name, namespace, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=namespace)))


def _admits(policies: list[dict], pod_labels: dict, port_name: str) -> list:
    """The `from` of each rule that lets traffic reach the named port of a pod with these
    labels ([] = no rule, None = from anywhere)."""
    sources = []
    for policy in policies:
        spec = policy["spec"]
        if not spec["podSelector"].get("matchLabels", {}).items() <= pod_labels.items():
            continue
        for rule in spec.get("ingress", []):
            ports = {p["port"] for p in rule.get("ports", [])}
            if not ports or port_name in ports:
                sources.append(rule.get("from"))
    return sources


def test_network_policies_deny_ingress_but_where_it_is_needed():
    """Ingress denied to every pod of the namespace, then: the web port from anywhere, each
    `metrics` port from the monitoring namespace only, the webhook server's port (its caller,
    the api-server, is no pod) from anywhere; the `probes` ports to no pod (the kubelet asks
    from the node). Egress is left open (documented)."""
    docs = _render()
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    deny = [p for p in policies if p["spec"]["podSelector"] == {}]
    assert deny and deny[0]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    assert all(p["spec"]["policyTypes"] == ["Ingress"] for p in policies)
    webhook = next(d for d in _render("deploy/webhook") if d["kind"] == "Deployment")
    pods = [d for d in docs if d["kind"] == "Deployment"] + [webhook]
    monitoring = [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    expected = {"web": {"http": [None]}, "watcher": {"metrics": [monitoring], "probes": []},
                "worker": {"metrics": [monitoring], "probes": []}, "webhook": {"https": [None]}}
    for pod in pods:
        template = pod["spec"]["template"]
        labels = template["metadata"]["labels"]
        (container,) = template["spec"]["containers"]
        ports = {p["name"] for p in container["ports"]}
        found = {port: _admits(policies, labels, port) for port in ports}
        assert found == expected[labels["app.kubernetes.io/component"]], pod["metadata"]["name"]


def test_redis_refuses_writes_at_maxmemory_rather_than_evicting(tmp_path):
    """Compose's Redis, started with compose's own command line: maxmemory-policy noeviction
    (an evicted broker key is a lost task, an evicted cache key a wrong view of the cluster).
    deploy/ brings no Redis; docs/running/cluster.md asks the same of the one REDIS_URL names."""
    import redis

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    sh, dash_c, line = compose["services"]["redis"]["command"]
    assert (sh, dash_c) == ("sh", "-c") and "--maxmemory-policy noeviction" in line
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = line.replace("$$", "$") + f" --port {port} --bind 127.0.0.1 --save '' --dir {tmp_path}"
    server = subprocess.Popen(["sh", "-c", line], env={**os.environ, "REDIS_PASSWORD": "pw"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port, password="pw")

        def up() -> bool:
            try:
                return r.ping()
            except redis.ConnectionError:
                return False

        wait_for(up, 10, "redis-server up")
        assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        # Full: the next write is refused, and what was there stays.
        r.config_set("maxmemory", 4 * 2**20)
        with pytest.raises(redis.exceptions.OutOfMemoryError, match="maxmemory"):
            for i in range(100):
                r.set(f"key-{i}", b"x" * 2**19)
        assert r.exists("key-0") and r.exists(f"key-{i - 1}")
        assert "noeviction" in (REPO / "docs" / "running" / "cluster.md").read_text()
        assert "noeviction" in (REPO / "deploy" / "secret.example.yaml").read_text()
        r.close()
    finally:
        server.terminate()
        server.wait(10)


def test_a_stopping_worker_is_given_longer_than_its_runs_may_take():
    """A worker told to stop (a rollout, a drain) finishes the runs it holds: each may take
    up to the hard limit of the default deadline (``RECONCILERS_LEASE_SECONDS`` as deploy/
    sets it, else the default). A shorter grace period kills those runs mid-write, and their
    keys wait out the lease before the reaper retries them."""
    from reconcilers._base.conf import RunLimits, Settings

    docs = _render()
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"
                 and d["metadata"]["name"] == "django-crd-operator"]
    default = next(f.default for f in dataclasses.fields(Settings) if f.name == "lease_seconds")
    soft = float(config["data"].get("RECONCILERS_LEASE_SECONDS", default))
    worker = _pod_specs(docs)["django-crd-operator-worker"]
    grace = worker.get("terminationGracePeriodSeconds", 30)  # the Kubernetes default
    assert grace >= RunLimits(soft).hard + 10, (grace, RunLimits(soft).hard)

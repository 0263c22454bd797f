"""The operator runs as a ServiceAccount holding only the generated least-privilege RBAC: one
ClusterRole when it watches every namespace, a Role per namespace when it watches some."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from kubernetes import client, config

from reconcilers._authoring import rbac
from reconcilers._authoring.registry import registry
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FOO = "foos.samplecontroller.k8s.io"
SAMPLES = "samplecontroller.k8s.io"
REPO = Path(__file__).resolve().parents[2]


def _apply(kube, docs: list[dict]) -> None:
    api = client.RbacAuthorizationV1Api(kube)
    for doc in docs:
        ns = doc["metadata"].get("namespace")
        {"ClusterRole": lambda: api.create_cluster_role(doc),
         "ClusterRoleBinding": lambda: api.create_cluster_role_binding(doc),
         "Role": lambda: api.create_namespaced_role(ns, doc),
         "RoleBinding": lambda: api.create_namespaced_role_binding(ns, doc)}[doc["kind"]]()


def _delete_cluster_scoped(kube, name: str) -> None:
    api = client.RbacAuthorizationV1Api(kube)
    for delete in (api.delete_cluster_role_binding, api.delete_cluster_role):
        try:
            delete(name)
        except client.ApiException as e:
            if e.status != 404:
                raise


def _kubeconfig(kube, stack, namespace: str, path) -> str:
    """A kubeconfig holding a token of ServiceAccount ``operator`` (TokenRequest API)."""
    token = client.CoreV1Api(kube).create_namespaced_service_account_token(
        "operator", namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "local", "cluster": {
            "server": f"https://127.0.0.1:{stack.apiserver_port}",
            "certificate-authority": str(stack.pki_dir / "ca.crt")}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa"}}]}))
    return str(path)


@pytest.fixture
def more_namespaces(kube):
    """Fresh namespaces beyond ``namespace``, deleted afterwards."""
    core = client.CoreV1Api(kube)
    made: list[str] = []

    def make() -> str:
        name = f"t-{uuid.uuid4().hex[:10]}"
        core.create_namespace({"metadata": {"name": name, "labels": {"test": "true"}}})
        made.append(name)
        return name

    yield make
    for name in made:
        try:
            core.delete_namespace(name)
        except client.ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture(params=["cluster", "namespaced"])
def service_account_kubeconfig(request, kube, namespace, stack, tmp_path, settings):
    """A ServiceAccount with the generated RBAC - the ClusterRole, or the Roles for an
    operator watching ``namespace`` only - and a kubeconfig holding its token."""
    settings.RECONCILERS_LEASE_NAME = f"watcher-{namespace}"
    settings.RECONCILERS_LEASE_NAMESPACE = namespace
    name = f"operator-{namespace}"
    client.CoreV1Api(kube).create_namespaced_service_account(
        namespace, {"metadata": {"name": "operator"}})
    watched = [namespace] if request.param == "namespaced" else []
    docs = rbac.manifests([registry.get_class(FOO)], name, "operator", namespace, watched)
    _apply(kube, docs)
    yield _kubeconfig(kube, stack, namespace, tmp_path / "kubeconfig"), docs
    _delete_cluster_scoped(kube, name)


def test_the_generated_role_has_no_wildcards_and_no_secrets(kube, namespace, stack,
                                                             service_account_kubeconfig):
    _, docs = service_account_kubeconfig
    for doc in docs:
        for rule in doc.get("rules", []):
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
    assert any(line.startswith("foos.samplecontroller.k8s.io/finalizers ")
               and "[update]" in line for line in lines), out
    for line in lines:
        resource, *_rest = line.split()
        verbs = line[line.index("["):] if "[" in line else ""
        assert not resource.startswith("*") and "[*]" not in verbs, line
        assert not resource.startswith("secrets"), line


def test_the_sample_operator_works_with_only_the_generated_role(
        kube, namespace, operator, service_account_kubeconfig):
    kubeconfig, _ = service_account_kubeconfig
    operator.env.update({"KUBECONFIG": kubeconfig, "RECONCILERS_LEASE_NAMESPACE": namespace})
    operator.start_watcher(FOO)
    operator.start_worker()
    foos = client.CustomObjectsApi(kube)
    apps = client.AppsV1Api(kube)
    foos.create_namespaced_custom_object(SAMPLES, "v1alpha1", namespace, "foos", {
        "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
        "metadata": {"name": "rbac-foo"}, "spec": {"deploymentName": "rbac-foo", "replicas": 2}})

    def deployment():
        try:
            return apps.read_namespaced_deployment("rbac-foo", namespace)
        except client.ApiException:
            return None

    dep = wait_for(deployment, 60, "the Deployment, created with the ServiceAccount's rights")
    assert dep.metadata.owner_references[0].kind == "Foo"
    assert dep.metadata.owner_references[0].block_owner_deletion
    wait_for(lambda: "status" in foos.get_namespaced_custom_object(
        SAMPLES, "v1alpha1", namespace, "foos", "rbac-foo"), 30, "status")
    wait_for(lambda: any(e.reason == "Synced" for e in
                         client.CoreV1Api(kube).list_namespaced_event(namespace).items), 30,
             "the Synced event")
    foos.delete_namespaced_custom_object(SAMPLES, "v1alpha1", namespace, "foos", "rbac-foo")
    wait_for(lambda: deployment() is None, 60, "garbage collection")
    for proc in operator.watchers + operator.workers:
        # ApiError's text is "403 Forbidden: ..."; a bare "403" also matches timings and
        # resourceVersions, which grew enough to contain it once the cluster ran Pods.
        assert "Forbidden" not in proc.log(), proc.log()[-3000:]


def _rbac_command(*args: str, **env: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "manage.py", "rbac", *args], cwd=REPO, capture_output=True,
        text=True, check=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **env}).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_with_namespaces_the_command_prints_roles_only():
    docs = _rbac_command("--service-account", "operator", "--namespace", "ops",
                         OPERATOR_SAMPLES="0", RECONCILERS_NAMESPACES="team-a, team-b",
                         RECONCILERS_LEASE_NAMESPACE="ops")
    assert {(d["kind"], d["metadata"]["namespace"]) for d in docs} == {
        (kind, ns) for kind in ("Role", "RoleBinding") for ns in ("team-a", "team-b", "ops")}
    roles = {d["metadata"]["namespace"]: d["rules"] for d in docs if d["kind"] == "Role"}
    assert roles["team-a"] == roles["team-b"]
    assert any("probes/finalizers" in r["resources"] and r["verbs"] == ["update"]
               for r in roles["team-a"])
    assert not any("leases" in r["resources"] for r in roles["team-a"])
    # The operator's own namespace: its Lease, nothing of the reconcilers'.
    assert {res for r in roles["ops"] for res in r["resources"]} == {"leases"}
    # --namespaces overrides the setting; empty means every namespace: one ClusterRole.
    assert [d["kind"] for d in _rbac_command("--namespaces", "", OPERATOR_SAMPLES="0",
                                             RECONCILERS_NAMESPACES="team-a")] == ["ClusterRole"]


def test_with_namespaces_the_cluster_role_holds_only_what_is_cluster_scoped():
    # The samples' watcher installs their CRDs: that is cluster-scoped, and all it holds.
    docs = _rbac_command("--namespaces", "team-a", OPERATOR_SAMPLES="1")
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert {res for r in cluster_role["rules"] for res in r["resources"]} == {
        "customresourcedefinitions"}
    assert all(r.get("resourceNames") or r["verbs"] == ["create"] for r in cluster_role["rules"])
    assert {d["kind"] for d in docs} == {"ClusterRole", "Role"}


def _can(kube, user: str, verb: str, resource: str, namespace: str = "", group: str = "",
         subresource: str = "", name: str = "") -> bool:
    """The api-server's own answer (a SubjectAccessReview) for ServiceAccount ``user``."""
    ns = user.split(":")[2]
    review = client.AuthorizationV1Api(kube).create_subject_access_review({
        "spec": {"user": user, "groups": ["system:serviceaccounts",
                                          f"system:serviceaccounts:{ns}", "system:authenticated"],
                 "resourceAttributes": {"verb": verb, "resource": resource, "group": group,
                                        "namespace": namespace, "subresource": subresource,
                                        "name": name}}})
    return review.status.allowed


def test_the_namespaced_roles_allow_what_the_operator_does_and_nothing_outside(
        kube, stack, namespace, more_namespaces, tmp_path, settings):
    """The ServiceAccount lives in ``namespace`` (its Lease is there too) and the operator
    watches two other namespaces; a fourth is nobody's."""
    watched, elsewhere = [more_namespaces(), more_namespaces()], more_namespaces()
    settings.RECONCILERS_LEASE_NAMESPACE = namespace
    settings.RECONCILERS_LEASE_NAME = lease = f"watcher-{namespace}"
    name = f"operator-{namespace}"
    client.CoreV1Api(kube).create_namespaced_service_account(
        namespace, {"metadata": {"name": "operator"}})
    out = io.StringIO()
    call_command("rbac", name=name, service_account="operator", namespace=namespace,
                 namespaces=",".join(watched), stdout=out, stderr=io.StringIO())
    docs = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    try:
        _apply(kube, docs)
        sa = f"system:serviceaccount:{namespace}:operator"
        wait_for(lambda: _can(kube, sa, "list", "foos", watched[0], SAMPLES), 10, "the Role")
        for ns in watched:
            for verb in ("get", "list", "watch", "patch"):
                assert _can(kube, sa, verb, "foos", ns, SAMPLES), (verb, ns)
            for verb in ("get", "patch"):
                assert _can(kube, sa, verb, "foos", ns, SAMPLES, "status"), (verb, ns)
            assert _can(kube, sa, "update", "foos", ns, SAMPLES, "finalizers"), ns
            for verb in ("get", "list", "watch", "create", "patch", "delete"):
                assert _can(kube, sa, verb, "deployments", ns, "apps"), (verb, ns)
            for verb in ("create", "patch"):
                assert _can(kube, sa, verb, "events", ns, "events.k8s.io"), (verb, ns)
            assert not _can(kube, sa, "delete", "foos", ns, SAMPLES), ns
            assert not _can(kube, sa, "get", "secrets", ns), ns
            assert not _can(kube, sa, "get", "leases", ns, "coordination.k8s.io", name=lease)
        # The Lease, by name, in the operator's own namespace - and nothing else there.
        for verb in ("get", "update", "watch"):
            assert _can(kube, sa, verb, "leases", namespace, "coordination.k8s.io", name=lease)
        assert _can(kube, sa, "create", "leases", namespace, "coordination.k8s.io")
        assert not _can(kube, sa, "update", "leases", namespace, "coordination.k8s.io",
                        name="someone-elses")
        assert not _can(kube, sa, "list", "deployments", namespace, "apps")
        # Nothing in a namespace it does not watch, nothing at cluster scope.
        for verb in ("get", "list", "create", "patch", "delete"):
            assert not _can(kube, sa, verb, "deployments", elsewhere, "apps"), verb
            assert not _can(kube, sa, verb, "foos", elsewhere, SAMPLES), verb
        assert not _can(kube, sa, "create", "events", elsewhere, "events.k8s.io")
        assert not _can(kube, sa, "update", "foos", elsewhere, SAMPLES, "finalizers")
        for resource, group in (("deployments", "apps"), ("foos", SAMPLES), ("events", "events.k8s.io"),
                                ("leases", "coordination.k8s.io")):
            assert not _can(kube, sa, "list", resource, "", group), resource
        # Cluster-scoped: only the CRDs the samples' watcher installs, by name.
        assert _can(kube, sa, "patch", "customresourcedefinitions", "",
                    "apiextensions.k8s.io", name=FOO)
        assert not _can(kube, sa, "patch", "customresourcedefinitions", "",
                        "apiextensions.k8s.io", name="leases.coordination.k8s.io")
        assert not _can(kube, sa, "delete", "customresourcedefinitions", "",
                        "apiextensions.k8s.io", name=FOO)

        # And the same through a real token of the ServiceAccount.
        as_sa = config.new_client_from_config(
            config_file=_kubeconfig(kube, stack, namespace, tmp_path / "kubeconfig"))
        try:
            apps = client.AppsV1Api(as_sa)
            assert apps.list_namespaced_deployment(watched[1]).items == []
            for forbidden in (lambda: apps.list_namespaced_deployment(elsewhere),
                              lambda: apps.list_deployment_for_all_namespaces(),
                              lambda: client.CustomObjectsApi(as_sa).list_cluster_custom_object(
                                  SAMPLES, "v1alpha1", "foos")):
                with pytest.raises(client.ApiException) as caught:
                    forbidden()
                assert caught.value.status == 403
        finally:
            as_sa.close()
    finally:
        _delete_cluster_scoped(kube, name)


def test_cluster_scoped_needs_go_in_the_cluster_role_and_the_rest_in_each_role(settings):
    from reconcilers._authoring.reconciler import Reconciler
    from reconcilers._base.vocab import Owns, Watches

    settings.RECONCILERS_LEASE_NAMESPACE = "ops"

    class Tenants(Reconciler):  # a cluster-scoped primary owning namespaced children
        group, version, kind, namespaced = "example.com", "v1", "Tenant", False
        owns = [Owns("v1", "ConfigMap")]
        watches = [Watches("v1", "Node", map=lambda node: [], namespaced=False)]
        rbac_rules = [{"apiGroups": [""], "resources": ["secrets", "nodes/proxy"],
                       "verbs": ["get"]},
                      {"nonResourceURLs": ["/version"], "verbs": ["get"]}]

    docs = rbac.manifests([Tenants], "op", "operator", "ops", ["team-a"])
    by = {(d["kind"], d["metadata"].get("namespace")): d.get("rules") for d in docs}
    assert set(by) == {("ClusterRole", None), ("ClusterRoleBinding", None), ("Role", "team-a"),
                       ("RoleBinding", "team-a"), ("Role", "ops"), ("RoleBinding", "ops"),
                       ("Role", "default"), ("RoleBinding", "default")}

    def resources(rules):
        return {res for r in rules for res in r.get("resources", [])}

    assert resources(by[("ClusterRole", None)]) == {
        "tenants", "tenants/status", "tenants/finalizers", "nodes", "nodes/proxy"}
    assert {"nonResourceURLs": ["/version"], "verbs": ["get"]} in by[("ClusterRole", None)]
    assert resources(by[("Role", "team-a")]) == {"configmaps", "events", "secrets"}
    # Events of a cluster-scoped object are filed in ``default``.
    assert by[("Role", "default")] == [{"apiGroups": ["events.k8s.io"], "resources": ["events"],
                                        "verbs": ["create", "patch"]}]
    assert resources(by[("Role", "ops")]) == {"leases"}
    # Watching every namespace, all of it in one ClusterRole, the declared rules as declared.
    (cluster,) = [d for d in rbac.manifests([Tenants], "op") if d["kind"] == "ClusterRole"]
    assert resources(cluster["rules"]) == resources(
        r for rules in by.values() if rules for r in rules)
    assert {"apiGroups": [""], "resources": ["secrets", "nodes/proxy"],
            "verbs": ["get"]} in cluster["rules"]


def test_secure_metrics_add_the_rights_to_review_scrapes_and_they_suffice(
        kube, stack, namespace, metrics_tokens, settings, tmp_path):
    """With ``RECONCILERS_METRICS_SECURE`` the generated role lets the operator's
    ServiceAccount, holding nothing else, review a scrape's token and access; without it the
    role grants neither."""
    from reconcilers._kube import reviews

    def review_rules(docs: list[dict]) -> list[dict]:
        return [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]
                if {"tokenreviews", "subjectaccessreviews"} & set(r["resources"])]

    name = f"metrics-{namespace}"
    assert review_rules(rbac.manifests([], name)) == []
    settings.RECONCILERS_METRICS_SECURE = True
    assert review_rules(rbac.manifests([], name)) == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
         "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
         "verbs": ["create"]}]
    # The same rules in a namespaced layout: cluster-scoped, so in its ClusterRole.
    assert review_rules(rbac.manifests([], name, "operator", namespace, ["team-a"])) == \
        review_rules(rbac.manifests([], name))
    client.CoreV1Api(kube).create_namespaced_service_account(
        namespace, {"metadata": {"name": "operator"}})
    _apply(kube, rbac.manifests([], name, "operator", namespace))
    try:
        api = config.new_client_from_config(
            config_file=_kubeconfig(kube, stack, namespace, tmp_path / "kubeconfig"))
        reviewer = reviews.Reviewer(api)
        # RBAC is seen by the api-server's informers a moment after the binding is made.
        wait_for(lambda: reviewer.decide(f"Bearer {metrics_tokens['scraper']}").allowed,
                 timeout=30, what="the operator's ServiceAccount to review the scraper")
        assert reviewer.decide(f"Bearer {metrics_tokens['stranger']}").status == 403
        api.close()
    finally:
        _delete_cluster_scoped(kube, name)

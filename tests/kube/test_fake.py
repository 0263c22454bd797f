"""The fake cluster's own rules, in memory (no stack): what it refuses as the api-server
refuses it, what it says it does not model, and how a test seeds it. That it answers as the
real api-server does is ``tests/e2e/test_fake_conformance.py``'s to show."""

from __future__ import annotations

import pytest

from reconcilers._kube import kube
from reconcilers.testing import FakeCluster, NotModelled, reconcile_once
from tests.helpers import REPO

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
PODSET = REPO / "reconcilers/contrib/podset/examples/podset.yaml"


def _configmap(name: str, **meta) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta},
            "data": {"k": "v"}}


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster(crds=[])


@pytest.mark.parametrize("method, path, options, missing", [
    ("GET", CONFIGMAPS, {"query": {"watch": "true"}}, "watch="),
    ("POST", CONFIGMAPS, {"query": {"dryRun": "All"}}, "dryRun="),
    ("PATCH", CONFIGMAPS + "/one", {"content_type": "application/strategic-merge-patch+json"},
     "strategic merge"),
    ("DELETE", CONFIGMAPS + "/one", {"query": {"propagationPolicy": "Foreground"}},
     "propagationPolicy=Foreground"),
    ("GET", "/apis", {}, "discovery"),
    ("GET", "/api/v1/namespaces/default/pods/one/log", {}, "'log' subresource"),
])
def test_what_it_does_not_model_is_refused_by_name(cluster, method, path, options, missing):
    cluster.create(_configmap("one"))

    with pytest.raises(NotModelled, match=missing):
        kube.request(cluster, method, path, {"data": {"k": "w"}}, **options)


def test_a_list_longer_than_its_limit_is_not_paginated_but_refused(cluster):
    for name in ("a", "b"):
        cluster.create(_configmap(name))

    assert len(kube.request(cluster, "GET", CONFIGMAPS, query={"limit": "2"})["items"]) == 2
    with pytest.raises(NotModelled, match="paginated"):
        kube.request(cluster, "GET", CONFIGMAPS, query={"limit": "1"})


def test_a_kind_it_does_not_serve_is_named(cluster):
    with pytest.raises(NotModelled, match="example.com/v1 Widget: give it the "
                                          "CustomResourceDefinition"):
        cluster.create({"apiVersion": "example.com/v1", "kind": "Widget",
                        "metadata": {"name": "w"}})


def test_a_reconciler_using_expectations_is_told_they_need_redis():
    cluster = FakeCluster.from_yaml(PODSET)

    run = reconcile_once("podsets.samples.django-crd-operator.io", "default", "example-podset",
                         cluster=cluster)

    assert run.outcome == "error"
    assert isinstance(run.error, NotImplementedError)
    assert "ctx.expectations keeps its state in Redis" in str(run.error)


def test_seeded_objects_keep_status_and_find_their_owners_by_name(cluster):
    owner = cluster.create(_configmap("owner", namespace="elsewhere"))
    child = cluster.create({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "child", "namespace": "elsewhere", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner"}]},
        "spec": {"replicas": 1}, "status": {"availableReplicas": 1}})

    assert cluster.get("v1", "Namespace", "elsewhere") is not None  # made for them
    assert child["status"] == {"availableReplicas": 1}
    assert child["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    with pytest.raises(LookupError, match="create the owner first"):
        cluster.create(_configmap("orphan", ownerReferences=[
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "nobody"}]))


def test_a_seeded_deletion_leaves_the_object_held_by_its_finalizers(cluster):
    held = cluster.create({**_configmap("going"), "metadata": {
        "name": "going", "finalizers": ["example.com/cleanup"],
        "deletionTimestamp": "2026-01-01T00:00:00Z"}})

    assert held["metadata"]["deletionTimestamp"]
    assert held["metadata"]["finalizers"] == ["example.com/cleanup"]
    kube.request(cluster, "PATCH", CONFIGMAPS + "/going", {"metadata": {"finalizers": None}},
                 content_type=kube.MERGE_PATCH)
    assert cluster.get("v1", "ConfigMap", "going") is None


def test_json_patches_move_copy_and_refuse_a_missing_path(cluster):
    cluster.create(_configmap("one"))
    patched = kube.request(cluster, "PATCH", CONFIGMAPS + "/one", [
        {"op": "add", "path": "/data/b", "value": "2"},
        {"op": "copy", "from": "/data/b", "path": "/data/c"},
        {"op": "move", "from": "/data/k", "path": "/data/a"},
        {"op": "remove", "path": "/data/b"}], content_type="application/json-patch+json")
    assert patched["data"] == {"a": "v", "c": "2"}

    with pytest.raises(kube.ApiError) as refused:
        kube.request(cluster, "PATCH", CONFIGMAPS + "/one",
                     [{"op": "remove", "path": "/data/nothing"}],
                     content_type="application/json-patch+json")
    assert (refused.value.status, refused.value.reason) == (422, "Invalid")


def test_a_conflicting_apply_is_told_apart_from_a_stale_write(cluster):
    """``ctx`` retries a write refused for a change since its read, never an apply's conflict
    with another manager: the fake's 409s carry the causes that tell them apart."""
    cluster.create(_configmap("one"))
    apply = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one"},
             "data": {"k": "mine"}}
    with pytest.raises(kube.ApiError) as conflict:
        kube.request(cluster, "PATCH", CONFIGMAPS + "/one", apply,
                     query={"fieldManager": "me"}, content_type=kube.APPLY_PATCH)
    with pytest.raises(kube.ApiError) as stale:
        kube.request(cluster, "PUT", CONFIGMAPS + "/one",
                     {**_configmap("one"), "metadata": {"name": "one", "resourceVersion": "1"}})

    assert conflict.value.conflict and not conflict.value.changed_since_read
    assert "conflict with" in conflict.value.message and ".data.k" in conflict.value.message
    assert stale.value.changed_since_read


def test_bad_selectors_are_refused_as_bad_requests(cluster):
    for query in ({"labelSelector": "app in web"}, {"fieldSelector": "data.k=v"}):
        with pytest.raises(kube.ApiError) as refused:
            kube.request(cluster, "GET", CONFIGMAPS, query=query)
        assert refused.value.status == 400


def test_a_run_takes_a_cluster_or_an_api_not_both(cluster):
    with pytest.raises(TypeError, match="an api or a cluster"):
        reconcile_once("foos.samplecontroller.k8s.io", "default", "x", cluster=cluster,
                       api=cluster)


def test_ctx_apply_and_delete_run_on_it_as_on_the_api_server():
    """``ctx.apply`` sends its apply conditional on the child's uid and resourceVersion, and
    ``ctx.delete`` with preconditions: the fake honours both."""
    from reconcilers._base.vocab import GVR
    from reconcilers._base.reconcile import Key
    from reconcilers._kube.context import Context

    cluster = FakeCluster(crds=[])
    parent = cluster.create(_configmap("parent"))
    ctx = Context(Key("parents", "default", "parent"), parent,
                  primary=GVR.of("v1", "ConfigMap"), api=cluster)
    desired = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "child", "labels": {"a": "1", "b": "2"}}, "data": {"k": "v"}}

    made = ctx.apply(desired)
    again = ctx.apply(desired)
    assert again["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]
    assert ctx.changed_children == ["ConfigMap/child"]  # the second apply changed nothing

    desired["metadata"]["labels"] = {"a": "1"}
    trimmed = ctx.apply(desired)
    assert trimmed["metadata"]["labels"] == {"a": "1"}  # what it stopped applying is gone
    assert [m["manager"] for m in trimmed["metadata"]["managedFields"]] == ["parents"]

    assert ctx.delete("v1", "ConfigMap", "child") is True
    assert ctx.delete("v1", "ConfigMap", "child") is False


def test_the_samples_unit_tests_need_no_service_at_all(tmp_path):
    """What a Django team runs under plain pytest: the Foo sample's unit tests, with every
    service the operator uses out of reach (PostgreSQL and Redis on a closed port, no
    kubeconfig, no local stack's env file), pass on the fake cluster alone."""
    import os
    import subprocess
    import sys

    from tests.helpers import REPO, free_port

    closed = free_port()
    env = {**os.environ, "DEBUG": "1", "OPERATOR_SAMPLES": "1",
           "OPERATOR_ENV_FILE": str(tmp_path / "no-env"),
           "DATABASE_URL": f"postgres://nobody:none@127.0.0.1:{closed}/none",
           "REDIS_URL": f"redis://127.0.0.1:{closed}/0", "KUBECONFIG": str(tmp_path / "none"),
           "OPERATOR_STATE_DIR": str(tmp_path / "no-stack")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/contrib/test_samplecontroller.py", "-q",
         "-p", "no:cacheprovider"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "error" not in done.stdout.lower(), done.stdout

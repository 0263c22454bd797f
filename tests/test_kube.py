"""The one door to Kubernetes, against the real api-server: calls, paths and error meanings."""

from __future__ import annotations

import pytest

from reconcilers import kube
from reconcilers.vocab import GVR
from tests.helpers import in_threads, made_together

CONFIGMAPS = GVR.of("v1", "ConfigMap")


def test_get_or_none_reads_an_object_and_says_none_for_a_missing_one(api, namespace):
    kube.request(api, "POST", CONFIGMAPS.path(namespace),
                 {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    assert kube.get_or_none(api, CONFIGMAPS.path(namespace, "cm"))["data"] == {"a": "1"}
    assert kube.get_or_none(api, CONFIGMAPS.path(namespace, "nope")) is None


def test_a_conflict_is_a_temporary_api_error_with_the_servers_message(api, namespace):
    body = {"metadata": {"name": "cm"}}
    kube.request(api, "POST", CONFIGMAPS.path(namespace), body)
    with pytest.raises(kube.ApiError) as err:
        kube.request(api, "POST", CONFIGMAPS.path(namespace), body)
    e = err.value
    assert (e.status, e.reason, e.conflict, e.temporary, e.permanent) == (
        409, "AlreadyExists", True, True, False)
    assert '"cm" already exists' in e.message and str(e).startswith("409 AlreadyExists")


def test_an_invalid_object_is_a_permanent_api_error(api, namespace):
    with pytest.raises(kube.ApiError) as err:
        kube.request(api, "POST", CONFIGMAPS.path(namespace), {"metadata": {"name": "Not_Valid"}})
    assert err.value.status == 422 and err.value.permanent


def test_api_errors_are_still_the_official_clients_exception(api, namespace):
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException):
        kube.request(api, "GET", CONFIGMAPS.path(namespace, "nope"))


def test_merge_patch_and_server_side_apply(api, namespace):
    kube.request(api, "POST", CONFIGMAPS.path(namespace), {"metadata": {"name": "cm"}})
    patched = kube.request(api, "PATCH", CONFIGMAPS.path(namespace, "cm"), {"data": {"b": "2"}},
                           content_type=kube.MERGE_PATCH)
    assert patched["data"] == {"b": "2"}
    applied = kube.request(api, "PATCH", CONFIGMAPS.path(namespace, "cm"),
                           {"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "cm"}, "data": {"c": "3"}},
                           query={"fieldManager": "test"}, content_type=kube.APPLY_PATCH)
    assert applied["data"]["c"] == "3"


def test_the_framework_resources_have_their_paths():
    assert kube.LEASES.path("ns", "l") == "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"
    assert kube.EVENTS.path("ns") == "/api/v1/namespaces/ns/events"
    assert kube.CRDS.path(None, "a.b") == (
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/a.b")


def test_a_retry_after_header_is_read_and_bounded():
    from kubernetes.client.exceptions import ApiException

    exc = ApiException(status=429, reason="TooManyRequests")
    exc.headers = {"Retry-After": "99999"}
    assert kube.ApiError.from_exception(exc).retry_after == kube.MAX_RETRY_AFTER
    exc.headers = {"Retry-After": "2"}
    assert kube.ApiError.from_exception(exc).retry_after == 2.0
    exc.headers = {"Retry-After": "nan"}
    assert kube.ApiError.from_exception(exc).retry_after is None


def test_threads_starting_at_once_share_one_client(stack, monkeypatch, tmp_path):
    """The process's client is made once, however many run threads ask for it first at once."""
    import shutil

    kubeconfig = tmp_path / "kubeconfig"  # a path of its own: a client not made before
    shutil.copy(stack.kubeconfig, kubeconfig)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    slow_client, made = made_together(kube.ApiClient, 4)
    monkeypatch.setattr(kube, "ApiClient", slow_client)
    got = in_threads(kube.api_client, 4)
    assert len(made) == 1 and len({id(c) for c in got}) == 1 and kube.api_client() is got[0]
    assert kube.version(got[0])["major"]

"""The lean transport (``reconcilers/transport.py``) against the real api-server: connections
kept and replaced, credentials, answers of every size, failures as temporary errors."""

from __future__ import annotations

import copy
import io
import os
import subprocess

import pytest

from reconcilers import kube, transport
from reconcilers.vocab import GVR
from tests.helpers import Relay, in_threads, wait_for

CONFIGMAPS = GVR.of("v1", "ConfigMap")
REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


def _client(api: kube.ApiClient, **changes) -> kube.ApiClient:
    configuration = copy.copy(api.configuration)
    configuration.api_key = dict(configuration.api_key)
    for name, value in changes.items():
        setattr(configuration, name, value)
    return kube.ApiClient(configuration)


def _whoami(api: kube.ApiClient) -> str:
    review = kube.request(api, "POST", REVIEWS, {"apiVersion": "authentication.k8s.io/v1",
                                                 "kind": "SelfSubjectReview"})
    return review["status"]["userInfo"]["username"]


@pytest.fixture
def relay(stack):
    r = Relay(("127.0.0.1", stack.apiserver_port))
    yield r
    r.close()


@pytest.fixture
def relayed(api, relay):
    client = _client(api, host=f"https://127.0.0.1:{relay.port}")
    yield client
    client.close()


def test_calls_share_one_kept_alive_connection(api, namespace):
    kube.request(api, "POST", CONFIGMAPS.path(namespace), {"metadata": {"name": "cm"}})
    for i in range(20):
        kube.request(api, "PATCH", CONFIGMAPS.path(namespace, "cm"), {"data": {"i": str(i)}},
                     content_type=kube.MERGE_PATCH)
    assert kube.request(api, "GET", CONFIGMAPS.path(namespace, "cm"))["data"] == {"i": "19"}
    assert api.transport.opened == 1


def test_threads_at_once_each_get_an_answer_and_the_pool_stays_bounded(api, namespace):
    path = CONFIGMAPS.path(namespace)
    answers = in_threads(lambda: [kube.request(api, "GET", path)["kind"] for _ in range(10)], 8)
    assert answers == [["ConfigMapList"] * 10] * 8
    assert 1 <= api.transport.opened <= 8
    assert len(api.transport._idle) <= api.configuration.connection_pool_maxsize


def test_an_idle_connection_the_server_closed_is_replaced_before_use(relayed, relay):
    assert kube.version(relayed)["major"]
    relay.cut()
    wait_for(lambda: relayed.transport._idle[0].dropped(), 5, "the close to reach the client")
    assert kube.version(relayed)["major"]
    assert relayed.transport.opened == 2


def test_a_connection_closed_the_instant_before_a_call_is_retried_only_when_that_is_safe(
        relayed, relay, namespace, monkeypatch):
    """A server may close a kept-alive connection just as a request goes out. A GET is sent
    again on a new connection; a write the server may have received is not - the caller gets
    a temporary error (a run retries its key) rather than a second write."""
    monkeypatch.setattr(transport._Connection, "dropped", lambda self: False)
    kube.request(relayed, "POST", CONFIGMAPS.path(namespace), {"metadata": {"name": "cm"}})
    relay.cut()
    assert kube.request(relayed, "GET", CONFIGMAPS.path(namespace, "cm"))["metadata"]["name"]
    assert relayed.transport.opened == 2
    relay.cut()
    with pytest.raises(kube.ApiError) as err:
        kube.request(relayed, "PATCH", CONFIGMAPS.path(namespace, "cm"), {"data": {"a": "1"}},
                     content_type=kube.MERGE_PATCH)
    assert err.value.status == 0 and err.value.temporary
    assert "closed the connection" in err.value.message
    assert kube.request(relayed, "GET", CONFIGMAPS.path(namespace, "cm")).get("data") is None


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "official"])
def test_an_unreachable_api_server_is_a_temporary_error(api, settings, lean):
    """On either path: no answer is a temporary ``ApiError`` of status 0, not an exception
    from inside an HTTP client."""
    settings.RECONCILERS_LEAN_TRANSPORT = lean
    # No refresh hook: the kubeconfig loader's sets the host back on every call.
    unreachable = _client(api, host="https://127.0.0.1:1", refresh_api_key_hook=None,
                          retries=0)
    with pytest.raises(kube.ApiError) as err:
        kube.version(unreachable)
    assert err.value.status == 0 and err.value.temporary
    assert "Connection refused" in err.value.message


def test_the_token_is_asked_for_on_every_call(api):
    """In-cluster tokens rotate and exec plugins refresh theirs: the configuration's refresh
    hook runs before each request, as it does on the official client's path."""
    token = api.configuration.api_key["authorization"]
    stale = _client(api, api_key={"authorization": "Bearer not-a-token"},
                    refresh_api_key_hook=None)
    with pytest.raises(kube.ApiError) as err:
        _whoami(stale)
    assert err.value.status == 401 and err.value.permanent
    stale.configuration.refresh_api_key_hook = \
        lambda cfg: cfg.api_key.__setitem__("authorization", token)
    assert _whoami(stale) == "admin"


def test_a_client_certificate_is_presented(api, stack, tmp_path):
    pki = stack.pki_dir
    key, csr, crt = (tmp_path / n for n in ("user.key", "user.csr", "user.crt"))
    subprocess.run(["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", csr, "-subj", "/CN=cert-user/O=system:masters"],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", pki / "ca.crt",
                    "-CAkey", pki / "ca.key", "-CAcreateserial", "-days", "1", "-out", crt],
                   check=True, capture_output=True)
    by_certificate = _client(api, api_key={}, refresh_api_key_hook=None, cert_file=str(crt),
                             key_file=str(key))
    assert _whoami(by_certificate) == "cert-user"


def test_an_unknown_authority_is_refused(api, tmp_path):
    other = tmp_path / "other-ca.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    tmp_path / "other.key", "-out", other, "-subj", "/CN=other", "-days", "1"],
                   check=True, capture_output=True)
    with pytest.raises(kube.ApiError) as err:
        kube.version(_client(api, ssl_ca_cert=str(other)))
    assert err.value.status == 0 and "certificate verify failed" in err.value.message


def test_answers_of_any_size_arrive_whole(api, namespace):
    """Small answers come with a Content-Length, large ones chunked."""
    big = "x" * 300_000
    kube.request(api, "POST", CONFIGMAPS.path(namespace),
                 {"metadata": {"name": "big"}, "data": {"v": big}})
    for i in range(30):
        kube.request(api, "POST", CONFIGMAPS.path(namespace),
                     {"metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}})
    assert kube.request(api, "GET", CONFIGMAPS.path(namespace, "big"))["data"]["v"] == big
    listed = kube.request(api, "GET", CONFIGMAPS.path(namespace))["items"]
    assert len(listed) >= 31 and api.transport.opened == 1


def test_a_forked_child_makes_connections_of_its_own(api, namespace):
    assert kube.version(api)["major"]
    pid = os.fork()
    if pid == 0:  # the child: a call on the client it inherited, on a connection of its own
        try:
            kube.version(api)
            os._exit(0 if api.transport.opened == 2 else 1)
        except BaseException:
            os._exit(2)
    assert os.waitpid(pid, 0)[1] == 0
    assert kube.version(api)["major"] and api.transport.opened == 1


def test_the_lean_transport_can_be_turned_off(api, namespace, settings):
    settings.RECONCILERS_LEAN_TRANSPORT = False
    official = _client(api)
    assert official.transport is None
    kube.request(official, "POST", CONFIGMAPS.path(namespace), {"metadata": {"name": "cm"}})
    with pytest.raises(kube.ApiError) as err:
        kube.request(official, "POST", CONFIGMAPS.path(namespace), {"metadata": {"name": "cm"}})
    assert err.value.conflict and '"cm" already exists' in err.value.message


def test_a_configured_proxy_keeps_the_official_path(api):
    proxied = _client(api, proxy="http://127.0.0.1:3128")
    assert proxied.transport is None
    assert api.transport is not None


def test_chunked_bodies_with_extensions_and_trailers():
    wire = b"4;ext=1\r\nabcd\r\n3\r\nefg\r\n0\r\nX-Trailer: t\r\n\r\nNEXT"
    rfile = io.BufferedReader(io.BytesIO(wire))
    assert transport._chunked(rfile) == b"abcdefg"
    assert rfile.read() == b"NEXT"  # the connection is left at the next answer
    with pytest.raises(transport.ConnectionFailed):
        transport._chunked(io.BufferedReader(io.BytesIO(b"4\r\nab")))


def test_headers_are_read_case_insensitively_and_repeated_ones_joined():
    rfile = io.BufferedReader(io.BytesIO(b"Retry-After: 3\r\nWarning: a\r\nwarning: b\r\n\r\n"))
    assert transport._headers(rfile) == {"retry-after": "3", "warning": "a, b"}
    with pytest.raises(ValueError):
        transport._status_line(b"SSH-2.0-OpenSSH\r\n")

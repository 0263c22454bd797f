"""The one door to Kubernetes, against the real api-server: calls, paths and error meanings;
the connections under them (urllib3's pool, the client's TLS settings and credentials), kept,
replaced and refused."""

from __future__ import annotations

import copy
import io
import os
import socket
import subprocess
import threading
import time

import pytest
import urllib3

from reconcilers._kube import kube
from reconcilers._base.vocab import GVR
from tests.helpers import Relay, in_threads, made_together, wait_for

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
def connects(monkeypatch) -> list:
    """Every connection made from now on (a TCP and TLS handshake each)."""
    made = []
    connect = urllib3.connection.HTTPSConnection.connect

    def counted(self) -> None:
        made.append(self)
        connect(self)
    monkeypatch.setattr(urllib3.connection.HTTPSConnection, "connect", counted)
    return made


@pytest.fixture
def relay(stack):
    r = Relay(("127.0.0.1", stack.apiserver_port))
    yield r
    r.close()


@pytest.fixture
def relayed(api, relay):
    # No refresh hook: the kubeconfig loader's sets the host back on every call.
    client = _client(api, host=f"https://127.0.0.1:{relay.port}", refresh_api_key_hook=None)
    yield client
    client.close()


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
    assert kube.EVENTS.path("ns") == "/apis/events.k8s.io/v1/namespaces/ns/events"
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


def test_an_error_answer_is_read_for_its_status_object_and_retry_after():
    answer = urllib3.HTTPResponse(
        body=io.BytesIO(b'{"kind":"Status","reason":"TooManyRequests","message":"slow down"}'),
        status=429, reason="Too Many Requests", headers={"Retry-After": "3"},
        preload_content=False)
    error = kube.ApiError.from_response(answer)
    assert (error.status, error.reason, error.message, error.retry_after, error.temporary) == (
        429, "TooManyRequests", "slow down", 3.0, True)


# --- connections -----------------------------------------------------------------------------


def test_calls_share_one_kept_alive_connection(api, namespace, connects):
    kube.request(api, "POST", CONFIGMAPS.path(namespace), {"metadata": {"name": "cm"}})
    for i in range(20):
        kube.request(api, "PATCH", CONFIGMAPS.path(namespace, "cm"), {"data": {"i": str(i)}},
                     content_type=kube.MERGE_PATCH)
    assert kube.request(api, "GET", CONFIGMAPS.path(namespace, "cm"))["data"] == {"i": "19"}
    assert len(connects) == 1


def test_threads_at_once_each_get_an_answer_and_the_pool_stays_bounded(api, namespace,
                                                                       connects):
    path = CONFIGMAPS.path(namespace)
    answers = in_threads(lambda: [kube.request(api, "GET", path)["kind"] for _ in range(10)], 8)
    assert answers == [["ConfigMapList"] * 10] * 8
    assert 1 <= len(connects) <= 8
    kept = [c for c in _pool(api).pool.queue if c is not None and c.is_connected]
    assert len(kept) <= api.configuration.connection_pool_maxsize


def test_an_idle_connection_the_server_closed_is_replaced_before_use(relayed, relay,
                                                                     connects):
    assert kube.version(relayed)["major"]
    relay.cut()
    idle = _pool(relayed).pool.queue[-1]
    wait_for(lambda: not idle.is_connected, 5, "the close to reach the client")
    assert kube.version(relayed)["major"]
    assert len(connects) == 2


def test_a_connection_closed_the_instant_before_a_call_is_retried_only_when_that_is_safe(
        relayed, relay, namespace, monkeypatch, connects):
    """A server may close a kept-alive connection just as a request goes out. A GET is sent
    again on a new connection; a write the server may have received is not - the caller gets
    a temporary error (a run retries its key) rather than a second write."""
    monkeypatch.setattr(urllib3.connectionpool, "is_connection_dropped", lambda conn: False)
    kube.request(relayed, "POST", CONFIGMAPS.path(namespace), {"metadata": {"name": "cm"}})
    relay.cut()
    assert kube.request(relayed, "GET", CONFIGMAPS.path(namespace, "cm"))["metadata"]["name"]
    assert len(connects) == 2
    relay.cut()
    with pytest.raises(kube.ApiError) as err:
        kube.request(relayed, "PATCH", CONFIGMAPS.path(namespace, "cm"), {"data": {"a": "1"}},
                     content_type=kube.MERGE_PATCH)
    assert err.value.status == 0 and err.value.temporary
    assert kube.request(relayed, "GET", CONFIGMAPS.path(namespace, "cm")).get("data") is None


def test_an_unreachable_api_server_is_a_temporary_error(api, connects):
    """No answer is a temporary ``ApiError`` of status 0, not an exception from inside an
    HTTP client; a refused connection is not tried again here (the caller backs off)."""
    # No refresh hook: the kubeconfig loader's sets the host back on every call.
    unreachable = _client(api, host="https://127.0.0.1:1", refresh_api_key_hook=None)
    with pytest.raises(kube.ApiError) as err:
        kube.version(unreachable)
    assert err.value.status == 0 and err.value.temporary
    assert "Connection refused" in err.value.message
    assert len(connects) == 1


def test_a_busy_answer_with_retry_after_reaches_the_caller_as_such(api):
    """429 (and 503) with Retry-After is the caller's to honour: an ``ApiError`` of that status
    carrying the delay, answered once - not retried inside the HTTP client, nor turned into
    "no answer"."""
    import http.server
    import json

    calls = []

    class Busy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            calls.append(self.path)
            body = json.dumps({"kind": "Status", "code": 429, "reason": "TooManyRequests",
                               "message": "slow down"}).encode()
            self.send_response(429)
            self.send_header("Retry-After", "2")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        busy = _client(api, host=f"http://127.0.0.1:{server.server_address[1]}",
                       refresh_api_key_hook=None)
        with pytest.raises(kube.ApiError) as err:
            kube.request(busy, "GET", "/api/v1/namespaces")
        assert (err.value.status, err.value.retry_after) == (429, 2.0)
        assert err.value.temporary and "slow down" in err.value.message
        assert calls == ["/api/v1/namespaces"]
    finally:
        server.shutdown()
        server.server_close()


def test_a_call_whose_answer_never_comes_fails_after_its_timeout_once(api):
    """A caller's timeout bounds the whole call - a leader's renewal must end inside its
    deadline - so a GET that timed out is not made again."""
    silent = _Silent()
    try:
        started = time.monotonic()
        with pytest.raises(kube.ApiError) as err:
            kube.version(_client(api, host=f"https://127.0.0.1:{silent.port}",
                                 refresh_api_key_hook=None), timeout=0.5)
        assert time.monotonic() - started < 1.5
        assert err.value.status == 0 and "timed out" in err.value.message
        assert silent.accepted == 1
    finally:
        silent.close()


def test_the_token_is_asked_for_on_every_call(api):
    """In-cluster tokens rotate and exec plugins refresh theirs: the configuration's refresh
    hook runs before each request, as it does on the official client's generated APIs."""
    # The client's name for the bearer token ("authorization" before v37, "BearerToken" since).
    (name,) = [n for n, s in api.configuration.auth_settings().items()
               if s["key"] == "authorization"]
    token = api.configuration.api_key[name]
    stale = _client(api, api_key={name: "Bearer not-a-token"}, refresh_api_key_hook=None)
    with pytest.raises(kube.ApiError) as err:
        _whoami(stale)
    assert err.value.status == 401 and err.value.temporary  # retried: the next call refreshes
    stale.configuration.refresh_api_key_hook = \
        lambda cfg: cfg.api_key.__setitem__(name, token)
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


def test_answers_of_any_size_arrive_whole(api, namespace, connects):
    """Small answers come with a Content-Length, large ones chunked."""
    big = "x" * 300_000
    kube.request(api, "POST", CONFIGMAPS.path(namespace),
                 {"metadata": {"name": "big"}, "data": {"v": big}})
    for i in range(30):
        kube.request(api, "POST", CONFIGMAPS.path(namespace),
                     {"metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}})
    assert kube.request(api, "GET", CONFIGMAPS.path(namespace, "big"))["data"]["v"] == big
    listed = kube.request(api, "GET", CONFIGMAPS.path(namespace))["items"]
    assert len(listed) >= 31 and len(connects) == 1


def test_a_watch_streams_events_and_hands_its_connection_back(api, namespace, connects):
    listed = kube.request(api, "GET", CONFIGMAPS.path(namespace))
    resp = kube.request(api, "GET", CONFIGMAPS.path(namespace), stream=True, timeout=(5, 30),
                        query={"watch": "true", "timeoutSeconds": 2,
                               "fieldSelector": "metadata.name=cm",
                               "resourceVersion": listed["metadata"]["resourceVersion"]})
    kube.request(api, "POST", CONFIGMAPS.path(namespace), {"metadata": {"name": "cm"}})
    events = [(e["type"], e["object"]["metadata"]["name"]) for e in kube.watch_events(resp)]
    resp.release_conn()
    assert events == [("ADDED", "cm")]
    assert kube.version(api)["major"] and len(connects) == 2  # the watch's was kept


def test_a_forked_child_gets_a_client_of_its_own(stack, monkeypatch):
    """A child must not write on its parent's connections (a prefork worker)."""
    monkeypatch.setenv("KUBECONFIG", str(stack.kubeconfig))
    parent = kube.api_client()
    assert kube.version(parent)["major"]
    pid = os.fork()
    if pid == 0:
        try:
            child = kube.api_client()
            ok = child is not parent and kube.version(child)["major"]
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    assert os.waitpid(pid, 0)[1] == 0
    assert kube.api_client() is parent and kube.version(parent)["major"]


def test_a_configured_proxy_is_used(api, stack):
    """The client's proxy settings apply: an https api-server is reached through CONNECT."""
    proxy = _ConnectProxy()
    try:
        proxied = _client(api, proxy=f"http://127.0.0.1:{proxy.port}")
        assert kube.version(proxied)["major"]
        assert proxy.tunnels == [f"127.0.0.1:{stack.apiserver_port}"]
    finally:
        proxy.close()


def _pool(api: kube.ApiClient) -> urllib3.HTTPConnectionPool:
    return api.rest_client.pool_manager.connection_from_url(api.configuration.host)


class _Silent:
    """A server that accepts connections and never says a word."""

    def __init__(self):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def accepted(self) -> int:
        return len(self._held)

    def _accept(self) -> None:
        while True:
            try:
                self._held.append(self._listener.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self._listener.close()
        for s in self._held:
            s.close()


class _ConnectProxy:
    """An HTTP proxy that only tunnels (CONNECT), recording where to."""

    def __init__(self):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.tunnels: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:
                return
            head = b""
            while b"\r\n\r\n" not in head:
                head += near.recv(4096)
            target = head.split(b" ")[1].decode()
            self.tunnels.append(target)
            host, port = target.rsplit(":", 1)
            far = socket.create_connection((host, int(port)))
            near.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=Relay._pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self._listener.close()


def test_every_api_server_call_of_a_run_names_the_run():
    """The User-Agent names the run (``(run <token>-<random>)``), in the form the soak reads
    back from the api-server's audit log to attribute each write to its run."""
    from reconcilers._kube import kube
    from soak import audit

    assert "(run" not in kube.user_agent()
    with kube.acting_for_run("12-abcdef01"):
        assert kube.user_agent().endswith("(run 12-abcdef01)")
        assert audit.RUN.search(kube.user_agent()).group(1) == "12-abcdef01"
    assert "(run" not in kube.user_agent()


"""The webhook server under what production does to it: certificate files replaced under it
(as cert-manager renews a Secret: the volume's ``..data`` symlink swapped), a client that sends
a byte a second, more connections than its bound - and its readiness and metrics."""

from __future__ import annotations

import json
import os
import select
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client

from reconcilers._webhooks import certificates
from tests.e2e.test_webhooks import _create, _until_registered, foo, served
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TIMEOUT = 3  # --request-timeout of the servers below, seconds


def _secret_volume(directory: Path, pair: certificates.Certificates, version: str) -> None:
    """Lay ``pair`` out as the kubelet does a Secret: ``tls.crt -> ..data/tls.crt``, with
    ``..data`` a symlink to a timestamped directory, swapped in one rename."""
    versioned = directory / f"..{version}"
    versioned.mkdir(parents=True)
    for name, source in (("tls.crt", pair.cert), ("tls.key", pair.key)):
        (versioned / name).write_bytes(source.read_bytes())
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(Path("..data") / name)
    staged = directory / "..data_tmp"
    staged.symlink_to(versioned.name)
    os.rename(staged, directory / "..data")


def _peer_certificate(port: int, ca: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


def _der(pair: certificates.Certificates) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pair.cert.read_text())


@pytest.fixture
def hooks(kube, namespace, start_process, tmp_path, redis_client):
    """A server with a short request timeout, registered for this namespace only."""
    yield from served(kube, namespace, start_process, tmp_path, "tests.settings",
                      "--request-timeout", str(TIMEOUT))


def test_certificate_files_replaced_under_the_server_serve_the_api_servers_next_call(
        kube, namespace, start_process, tmp_path, redis_client):
    """The server starts on pair A (CA A). The configuration is then changed to trust only
    CA B, so the api-server's calls fail; once pair B replaces A's files - a symlink swap,
    as a Secret volume is updated - the api-server's next call succeeds, served by the same
    process: the new pair without a restart."""
    hooks_gen = served(kube, namespace, start_process, tmp_path, "tests.settings",
                       register=False)
    hooks = next(hooks_gen)
    try:
        first = certificates.ensure_certificates(hooks.dir, ["127.0.0.1"])  # served()'s own
        second = certificates.ensure_certificates(tmp_path / "b", ["127.0.0.1"])
        live = tmp_path / "live"
        _secret_volume(live, first, "2026_01")
        hooks.proc.stop()  # restarted on `live`, the files the test replaces
        hooks.start(cert_dir=live)
        pid = hooks.proc.pid
        hooks.register(ca=first.ca)
        _until_registered(kube, namespace)

        hooks.register(ca=second.ca)  # the api-server now trusts only B, the server serves A

        def refused() -> bool:
            try:
                _create(kube, namespace, foo("probe", "probe-nginx"), dry_run=True)
            except client.ApiException as exc:
                return "failed calling webhook" in json.loads(exc.body)["message"]
            return False
        wait_for(refused, 30, "the api-server to refuse pair A")

        _secret_volume(live, second, "2026_02")
        started = time.monotonic()

        def served_again() -> bool:
            try:
                got = _create(kube, namespace, foo("probe", "probe-nginx"), dry_run=True)
            except client.ApiException:
                return False
            return got["spec"].get("replicas") == 1
        wait_for(served_again, 15, "the api-server's calls to succeed with pair B")
        print(f"pair B served {time.monotonic() - started:.1f} s after the swap")
        assert hooks.proc.popen.poll() is None and hooks.proc.pid == pid
        assert _peer_certificate(hooks.port, second.ca) == _der(second)
        assert "webhook certificate reloaded" in hooks.proc.log()

        # A pair that does not load (a key from elsewhere) keeps the one served.
        third = certificates.ensure_certificates(tmp_path / "c", ["127.0.0.1"])
        broken = live / "..2026_03"
        broken.mkdir()
        (broken / "tls.crt").write_bytes(third.cert.read_bytes())
        (broken / "tls.key").write_bytes(second.key.read_bytes())
        (live / "..data_tmp").symlink_to(broken.name)
        os.rename(live / "..data_tmp", live / "..data")
        time.sleep(1.5)
        assert _peer_certificate(hooks.port, second.ca) == _der(second)
        _create(kube, namespace, foo("still", "still-nginx"), dry_run=True)
        assert "does not load, serving the previous pair" in hooks.proc.log()
    finally:
        hooks_gen.close()


def _client_hello() -> bytes:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _trickle(sock: socket.socket, data: bytes, limit: float) -> float:
    """Send ``data`` a byte a second; the seconds until the server closed the connection."""
    started = time.monotonic()
    for byte in data:
        try:
            sock.send(bytes([byte]))
            readable, _, _ = select.select([sock], [], [], 1.0)
            if readable and not sock.recv(4096):
                break
        except (OSError, ssl.SSLError):
            break
        if time.monotonic() - started > limit:
            raise AssertionError(f"still connected after {limit} s")
    return time.monotonic() - started


def test_a_client_sending_a_byte_a_second_loses_its_connection_at_the_timeout(hooks):
    """Trickled during the TLS handshake or after it, in the request's headers: cut once the
    request timeout passes, while others are served meanwhile."""
    context = ssl.create_default_context(cafile=str(hooks.dir / "ca.crt"))
    results: dict[str, float] = {}

    def handshake() -> None:
        with socket.create_connection(("127.0.0.1", hooks.port), timeout=30) as raw:
            results["handshake"] = _trickle(raw, _client_hello(), 20)

    def headers() -> None:
        raw = socket.create_connection(("127.0.0.1", hooks.port), timeout=30)
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            request = (b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\n" + b"X-Slow: " + b"a" * 200)
            results["headers"] = _trickle(tls, request, 20)

    threads = [threading.Thread(target=f) for f in (handshake, headers)]
    for thread in threads:
        thread.start()
    time.sleep(1)
    assert hooks.https("/healthz") == (200, {"status": "ok"})  # served meanwhile
    for thread in threads:
        thread.join(30)
    assert set(results) == {"handshake", "headers"}, results
    for phase, seconds in results.items():
        assert TIMEOUT - 0.5 <= seconds <= TIMEOUT + 3, (phase, seconds)
    # Each cut is logged by the worker as it closes the socket: the line may trail the close.
    wait_for(lambda: hooks.proc.log().count("cut: no complete request and answer") >= 2, 10,
             "both cuts logged")
    assert hooks.https("/healthz") == (200, {"status": "ok"})


def test_connections_beyond_the_bound_wait_or_are_refused_and_the_server_keeps_serving(
        kube, namespace, start_process, tmp_path, redis_client):
    """Four connections per worker, a backlog of eight: 200 idle connections. A request
    meanwhile waits (or its connection is refused) - never a crashed server; once the idle
    ones are gone it is answered at once."""
    gen = served(kube, namespace, start_process, tmp_path, "tests.settings",
                 "--request-timeout", str(TIMEOUT), "--max-connections", "4", "--threads", "2",
                 "--backlog", "8", register=False)
    hooks = next(gen)
    try:
        idle: list[socket.socket] = []
        for _ in range(200):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", hooks.port))
            idle.append(sock)
        time.sleep(0.5)
        started = time.monotonic()
        try:
            outcome = hooks.https("/healthz")
        except (urllib.error.URLError, OSError) as exc:  # refused, reset or timed out
            outcome = ("connection", type(exc).__name__)
        waited = time.monotonic() - started
        assert outcome == (200, {"status": "ok"}) or outcome[0] == "connection", outcome
        assert hooks.proc.popen.poll() is None
        for sock in idle:
            sock.close()
        started = time.monotonic()
        assert hooks.https("/healthz") == (200, {"status": "ok"})
        assert time.monotonic() - started < 2
        assert "Traceback" not in hooks.proc.log(), hooks.proc.log()[-3000:]
        print(f"during the flood: {outcome} after {waited:.1f} s")
    finally:
        gen.close()


def test_readiness_and_controller_runtime_webhook_metrics(hooks, kube, namespace):
    _until_registered(kube, namespace)
    status, body = hooks.https("/readyz")
    assert status == 200 and body["message"].startswith("certificate valid until")
    context = ssl.create_default_context(cafile=str(hooks.dir / "ca.crt"))
    with urllib.request.urlopen(f"https://127.0.0.1:{hooks.port}/metrics", context=context,
                                timeout=10) as resp:
        text = resp.read().decode()
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("controller_runtime_webhook_requests_total",
                    (("code", "200"), ("webhook", "/mutate")))] >= 1
    assert samples[("controller_runtime_webhook_requests_total",
                    (("code", "500"), ("webhook", "/convert")))] == 0  # from 0
    assert samples[("controller_runtime_webhook_requests_in_flight",
                    (("webhook", "/validate"),))] == 0
    assert samples[("controller_runtime_webhook_latency_seconds_count",
                    (("webhook", "/mutate"),))] >= 1


def test_a_worker_that_dies_is_replaced_and_the_master_keeps_the_port(hooks):
    import signal

    def workers() -> list[int]:
        path = Path(f"/proc/{hooks.proc.pid}/task/{hooks.proc.pid}/children")
        return [int(pid) for pid in path.read_text().split()]

    (worker,) = wait_for(workers, 10, "the worker process")
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: workers() and workers() != [worker], 30, "a new worker")

    def answers() -> bool:
        try:
            return hooks.https("/healthz") == (200, {"status": "ok"})
        except OSError:  # between the two workers
            return False
    wait_for(answers, 30, "serving again")
    assert hooks.proc.popen.poll() is None

"""The write fence of ``ctx``: a write cannot outlast the run's lease on its key."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from reconcilers._kube import kube
from reconcilers._kube.context import Context
from reconcilers._base.vocab import GVR, Key
from tests.test_context import probe  # noqa: F401 - the fixture

CONFIGMAPS = GVR.of("v1", "ConfigMap")


@pytest.fixture
def silent_server():
    """An api-server address that accepts connections and never answers: a write sent there
    hangs until its own timeout ends it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    listener.close()


def context_for(api, namespace: str, fence) -> Context:
    obj = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "owner", "namespace": namespace, "uid": "u",
                        "resourceVersion": "1"}}
    return Context(Key("cm", namespace, "owner"), obj, primary=CONFIGMAPS, api=api, fence=fence)


def held_for(seconds: float):
    """A run's fence whose lease ends ``seconds`` from now: it says how long is left."""
    until = time.monotonic() + seconds
    return lambda: until - time.monotonic()


def test_a_write_to_a_silent_api_server_ends_with_the_runs_lease_not_30_s_later(
        silent_server):
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = silent_server
    api = client.ApiClient(configuration)
    ctx = context_for(api, "ns", held_for(1.0))
    started = time.monotonic()
    with pytest.raises(kube.ApiError) as failed:
        ctx.patch("v1", "ConfigMap", "child", {"data": {"v": "1"}})
    assert failed.value.status == 0  # no answer: a temporary error, the key retried
    assert time.monotonic() - started < 1.5  # the lease, not the call's own 30 s timeout
    assert ctx.writes == []
    api.close()


def test_a_fenced_write_tells_the_api_server_its_deadline_too(api, namespace, monkeypatch):
    """Once sent, a write is the api-server's: its ``timeout`` makes the server abandon it at
    the lease's end instead of at its own default (60 s)."""
    sent = []
    real = kube.request

    def seen(api_, method, path, *args, **kwargs):
        sent.append((method, kwargs.get("query"), kwargs.get("timeout")))
        return real(api_, method, path, *args, **kwargs)

    monkeypatch.setattr(kube, "request", seen)
    ctx = context_for(api, namespace, held_for(20.0))
    created = ctx.create_or_update({"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"name": "child"}, "data": {"v": "1"}})
    assert created["data"] == {"v": "1"}
    ((method, query, timeout),) = [s for s in sent if s[0] == "POST"]
    assert 19 < float(query["timeout"].rstrip("s")) <= 20
    assert sum(timeout) <= 20


def test_an_unfenced_context_writes_as_before(api, namespace):
    ctx = context_for(api, namespace, None)
    ctx.create_or_update({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "child"}, "data": {"v": "1"}})
    assert [w[0] for w in ctx.writes] == ["POST"]


@pytest.mark.django_db(transaction=True)
def test_a_runs_writes_are_bounded_by_its_lease_on_the_key(api, probe, namespace, redis_client,
                                                          monkeypatch):
    from reconcilers.api import Reconciler, Registry, register
    from reconcilers._base.conf import RunLimits
    from tests.test_context import GROUP, VERSION, run_once

    sent = []
    real = kube.request

    def seen(api_, method, path, *args, **kwargs):
        if method != "GET":
            sent.append(kwargs.get("query") or {})
        return real(api_, method, path, *args, **kwargs)

    monkeypatch.setattr(kube, "request", seen)
    reg = Registry()

    @register(registry=reg)
    class Status(Reconciler):
        group, version, kind = GROUP, VERSION, "Probe"

        def reconcile(self, obj, ctx):
            ctx.patch_status({"phase": "fenced"})

    assert run_once(reg, "p", namespace, Status.name()).outcome == "success"
    assert probe()["status"]["phase"] == "fenced"
    (query,) = sent
    # The claim's lease less the second the fence keeps in hand, less the run so far.
    assert RunLimits.of(None).lease - 3 < float(query["timeout"].rstrip("s")) \
        < RunLimits.of(None).lease - 1

"""The write fence of ``ctx``: a write cannot outlast the run's lease on its key."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from reconcilers._kube import kube
from reconcilers._kube.context import Context
from reconcilers._base.vocab import GVR
from reconcilers._base.reconcile import Key
from tests.kube.test_context import probe  # noqa: F401 - the fixture

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
    from reconcilers.api import Reconciler, ReconcilerRegistry, register
    from reconcilers._base.conf import RunLimits
    from tests.kube.test_context import GROUP, VERSION, run_once

    sent = []
    real = kube.request

    def seen(api_, method, path, *args, **kwargs):
        if method != "GET":
            sent.append(kwargs.get("query") or {})
        return real(api_, method, path, *args, **kwargs)

    monkeypatch.setattr(kube, "request", seen)
    reg = ReconcilerRegistry()

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



class KeyTakenOver(Exception):
    """What the fence of a run whose key another run took raises (the ledger's LeaseLost)."""


class PausedAfterCheck:
    """A run's fence whose first check passes, after which - as if the run's process stopped
    right there, between the check and the write it guards - ``meanwhile`` happens. With
    ``lapses``, the pause outlasted the claim: another run took the key (``meanwhile`` is its
    write) and every later check refuses; without it, the claim still holds (``meanwhile`` is
    another writer's)."""

    def __init__(self, meanwhile, lapses: bool):
        self.meanwhile, self.lapses, self.checks = meanwhile, lapses, 0

    def __call__(self) -> float:
        self.checks += 1
        if self.checks == 1:
            self.meanwhile()
        elif self.lapses:
            raise KeyTakenOver("another run holds the key now")
        return 20.0


def config_maps(kube):
    from kubernetes import client

    return client.CoreV1Api(kube)


def read_config_map(kube, namespace: str, name: str):
    from kubernetes import client

    try:
        return config_maps(kube).read_namespaced_config_map(name, namespace)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def writes_meanwhile(kube, namespace: str, name: str, body: dict):
    """Another writer's merge patch of the ConfigMap ``name``, to make during a pause."""
    return lambda: config_maps(kube).patch_namespaced_config_map(name, namespace, body)


def owners_context(api, kube, namespace: str, fence) -> Context:
    """The context of a run of the ConfigMap ``owner`` (a real object: the garbage collector
    keeps the children it controls)."""
    found = read_config_map(kube, namespace, "owner") or config_maps(
        kube).create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    obj = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "owner", "namespace": namespace, "uid": found.metadata.uid,
                        "resourceVersion": found.metadata.resource_version}}
    return Context(Key("cm", namespace, "owner"), obj, primary=CONFIGMAPS, api=api, fence=fence)


def child(**data) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "child"},
            "data": data}


def test_a_delete_sent_after_its_runs_key_was_taken_over_and_the_object_changed_is_refused(
        api, kube, namespace, redis_client):
    """The fence checks, then the run stops (a paused process, a request held in the
    network) and the run that took its key over rewrites the object. The stopped run's
    delete, sent at last, carries the uid and resourceVersion it read: the api-server refuses
    it, and its second try, on a fresh read, meets the fence."""
    config_maps(kube).create_namespaced_config_map(
        namespace, {"metadata": {"name": "child"}, "data": {"by": "the first run"}})
    ctx = owners_context(api, kube, namespace, PausedAfterCheck(writes_meanwhile(
        kube, namespace, "child", {"data": {"by": "the successor"}}), lapses=True))
    with pytest.raises(KeyTakenOver):
        ctx.delete("v1", "ConfigMap", "child")
    assert read_config_map(kube, namespace, "child").data == {"by": "the successor"}
    assert ctx.writes == []


def test_an_apply_sent_after_its_runs_key_was_taken_over_and_the_child_changed_is_refused(
        api, kube, namespace, redis_client):
    owners_context(api, kube, namespace, None).apply(child(value="1"))
    successor = owners_context(api, kube, namespace, None)  # a run of the same reconciler
    ctx = owners_context(api, kube, namespace, PausedAfterCheck(
        lambda: successor.apply(child(value="3")), lapses=True))
    with pytest.raises(KeyTakenOver):
        ctx.apply(child(value="2"))
    assert read_config_map(kube, namespace, "child").data == {"value": "3"}
    assert ctx.writes == []


def test_a_run_still_holding_its_key_applies_and_deletes_over_a_change_made_since_it_read(
        api, kube, namespace, redis_client):
    """The condition changes nothing for a run that holds its key: another writer between
    its read and its write (or a cache a moment behind) costs a fresh read and a second
    write, not an error and a retry of the run."""
    owners_context(api, kube, namespace, None).apply(child(value="1"))
    ctx = owners_context(api, kube, namespace, PausedAfterCheck(writes_meanwhile(
        kube, namespace, "child", {"metadata": {"labels": {"other": "writer"}}}),
        lapses=False))
    ctx.apply(child(value="2"))
    found = read_config_map(kube, namespace, "child")
    assert found.data == {"value": "2"} and found.metadata.labels == {"other": "writer"}
    assert [method for method, _, _ in ctx.writes] == ["PATCH"]
    assert ctx.changed_children == ["ConfigMap/child"]

    ctx = owners_context(api, kube, namespace, PausedAfterCheck(writes_meanwhile(
        kube, namespace, "child", {"data": {"value": "4"}}), lapses=False))
    assert ctx.delete("v1", "ConfigMap", "child") is True
    assert read_config_map(kube, namespace, "child") is None
    assert ctx.delete("v1", "ConfigMap", "child") is False  # already gone


def test_an_apply_conflicting_with_another_field_manager_is_not_sent_twice(
        api, kube, namespace, redis_client):
    """Only a changed object is written again: an apply's conflict with another manager's
    fields stays the 409 it was (``force=True`` takes them over)."""
    from reconcilers._kube import kube as door

    owners_context(api, kube, namespace, None).apply(child(value="1"))
    door.request(api, "PATCH", CONFIGMAPS.path(namespace, "child"),
                 {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "child"},
                  "data": {"value": "mine"}},
                 query={"fieldManager": "someone-else", "force": "true"},
                 content_type=door.APPLY_PATCH)
    ctx = owners_context(api, kube, namespace, PausedAfterCheck(lambda: None, lapses=True))
    with pytest.raises(door.ApiError) as refused:
        ctx.apply(child(value="2"))
    assert refused.value.conflict and not refused.value.changed_since_read
    assert read_config_map(kube, namespace, "child").data == {"value": "mine"}

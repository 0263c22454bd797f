"""The reflector on the real api-server and Redis: list, watch, relist diffs, scoped caches."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from reconcilers._kube import cache, fence, kube
from reconcilers._watch.handlers import OWNED, Handler
from reconcilers._watch.reflector import Gone, Reflector
from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base.vocab import GVR, CacheScope
from reconcilers._base.reconcile import Key
from tests.helpers import wait_for

CONFIGMAPS = GVR.of("v1", "ConfigMap")


@pytest.fixture
def other_namespace(kube) -> str:
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": name, "labels": {"test": "true"}}})
    yield name
    core.delete_namespace(name)


class Recorder:
    def __init__(self):
        self.changes: list[tuple[str, dict | None, dict | None]] = []

    def __call__(self, trigger, old, new, change=None):
        self.changes.append((trigger, old, new))

    def names(self, trigger: str) -> list[str]:
        return sorted((new or old)["metadata"]["name"] for t, old, new in self.changes
                      if t == trigger)


def reflector(namespace, sink) -> Reflector:
    return Reflector(CONFIGMAPS, namespace, sink, threading.Event())


def make_cm(api, namespace, name, **meta):
    return kube.request(api, "POST", CONFIGMAPS.path(namespace),
                        {"metadata": {"name": name, **meta}, "data": {"v": "1"}})


def test_the_first_list_reports_every_object_and_marks_the_scope_synced(api, namespace,
                                                                        redis_client):
    make_cm(api, namespace, "one")
    make_cm(api, namespace, "two")
    sink = Recorder()
    reflector(namespace, sink).list(api, initial=True)
    assert [n for n in sink.names("added") if n != "kube-root-ca.crt"] == ["one", "two"]
    assert cache.is_synced(CONFIGMAPS, namespace)
    assert "managedFields" not in cache.get(CONFIGMAPS, namespace, "one")["metadata"]


def test_streams_of_two_namespaces_never_wipe_each_others_cache(api, namespace,
                                                                other_namespace, redis_client):
    make_cm(api, namespace, "mine")
    make_cm(api, other_namespace, "theirs")
    for ns in (namespace, other_namespace):  # kube-controller-manager adds one to a new namespace
        wait_for(lambda: kube.get_or_none(api, CONFIGMAPS.path(ns, "kube-root-ca.crt")), 30,
                 "the namespace's kube-root-ca.crt")
    for ns in (namespace, other_namespace):
        reflector(ns, Recorder()).list(api, initial=True)
    # A watcher restart: each stream lists its namespace again against the shared cache.
    sinks = {ns: Recorder() for ns in (namespace, other_namespace)}
    for ns, sink in sinks.items():
        reflector(ns, sink).list(api, initial=True)
    for sink in sinks.values():
        assert sink.changes == []  # nothing changed, nothing reported, nothing deleted
    assert cache.get(CONFIGMAPS, namespace, "mine") is not None
    assert cache.get(CONFIGMAPS, other_namespace, "theirs") is not None


def test_a_child_deleted_while_no_watcher_ran_still_names_its_owner(api, namespace,
                                                                    redis_client):
    owner = make_cm(api, namespace, "owner")
    make_cm(api, namespace, "child", ownerReferences=[{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
        "uid": owner["metadata"]["uid"], "controller": True}])
    reflector(namespace, Recorder()).list(api, initial=True)
    kube.request(api, "DELETE", CONFIGMAPS.path(namespace, "child"))

    sink = Recorder()
    reflector(namespace, sink).list(api, initial=True)  # the watcher comes back
    ((trigger, old, new),) = sink.changes
    assert (trigger, new) == ("deleted", None)

    class Owners(Reconciler):
        version, kind = "v1", "ConfigMap"

    assert Handler(Owners, OWNED).keys_for(old, new) == [Key("configmaps", namespace, "owner")]
    assert cache.get(CONFIGMAPS, namespace, "child") is None


def test_watch_events_update_the_cache_before_they_are_reported(api, namespace, redis_client):
    seen_in_cache = []

    def sink(trigger, old, new, change=None):
        obj = new or old
        seen_in_cache.append((trigger, cache.get(CONFIGMAPS, namespace, obj["metadata"]["name"])))

    r = reflector(namespace, sink)
    r.list(api, initial=True)
    seen_in_cache.clear()
    make_cm(api, namespace, "late")
    kube.request(api, "DELETE", CONFIGMAPS.path(namespace, "late"))
    def watch_until_aborted():
        try:
            r.watch(api)
        except Exception:
            assert r.stop_event.is_set()  # only our abort may end it

    thread = threading.Thread(target=watch_until_aborted, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if len(seen_in_cache) >= 2:
                break
            threading.Event().wait(0.05)
    finally:
        r.abort()
        thread.join(10)
    (added, added_obj), (deleted, deleted_obj) = seen_in_cache[:2]
    assert (added, deleted) == ("added", "deleted")
    assert added_obj is not None and deleted_obj is None


def test_an_expired_resource_version_means_relist_as_event_or_as_http_answer(api, namespace,
                                                                            monkeypatch):
    r = reflector(namespace, Recorder())
    with pytest.raises(Gone):
        r.handle({"type": "ERROR", "object": {"code": 410, "message": "too old"}})

    def gone(*args, **kwargs):
        raise kube.ApiError(410, "Expired", "too old resource version")

    monkeypatch.setattr(kube, "request", gone)
    r.resource_version = "1"
    with pytest.raises(Gone):
        r.watch(api)


def test_an_expired_continue_token_falls_back_to_one_unpaginated_list(
        api, namespace, redis_client, monkeypatch, settings):
    settings.RECONCILERS_LIST_PAGE_SIZE = 2
    for i in range(5):
        make_cm(api, namespace, f"cm{i}")
    real = kube.request
    queries = []

    def slow_list(client, method, path, body=None, query=None, **kwargs):
        queries.append(dict(query or {}))
        if (query or {}).get("continue"):
            raise kube.ApiError(410, "Expired", "The provided continue parameter is too old")
        return real(client, method, path, body, query=query, **kwargs)

    monkeypatch.setattr(kube, "request", slow_list)
    sink = Recorder()
    reflector(namespace, sink).list(api, initial=True)
    assert queries[-1] == {}  # the last request asked for everything at once
    assert len(queries) == 3
    assert {f"cm{i}" for i in range(5)} <= set(sink.names("added"))


def _run(r: Reflector) -> threading.Thread:
    thread = threading.Thread(target=r.run, daemon=True)
    thread.start()
    return thread


def _stop(r: Reflector, thread: threading.Thread) -> None:
    r.abort()
    thread.join(10)
    assert not thread.is_alive()


def _lists(monkeypatch) -> list[dict]:
    """The LIST requests made from now on (every GET of a collection without ``watch``)."""
    real, lists = kube.request, []

    def request(client, method, path, body=None, query=None, **kwargs):
        if method == "GET" and "watch" not in (query or {}):
            lists.append({"path": path, **(query or {})})
        return real(client, method, path, body, query=query, **kwargs)

    monkeypatch.setattr(kube, "request", request)
    return lists


def test_a_restarted_watcher_resumes_where_its_predecessor_stopped_without_listing(
        api, namespace, redis_client, monkeypatch):
    for name in ("kept", "changed", "removed"):
        make_cm(api, namespace, name)
    before = reflector(namespace, Recorder())
    thread = _run(before)
    wait_for(lambda: before.resource_version, 30, "the first list")
    make_cm(api, namespace, "late")  # an event after the list: the position moves past it
    wait_for(lambda: "%s/late" % namespace in before.known, 30, "the late object's event")
    _stop(before, thread)

    # While no watcher runs:
    kube.request(api, "PUT", CONFIGMAPS.path(namespace, "changed"),
                 {**kube.request(api, "GET", CONFIGMAPS.path(namespace, "changed")),
                  "data": {"v": "2"}})
    kube.request(api, "DELETE", CONFIGMAPS.path(namespace, "removed"))

    lists = _lists(monkeypatch)
    sink = Recorder()
    after = reflector(namespace, sink)
    thread = _run(after)
    try:
        wait_for(lambda: len(sink.changes) >= 2, 30, "the two changes made meanwhile")
        threading.Event().wait(0.5)  # room for anything else it would wrongly report
    finally:
        _stop(after, thread)
    assert lists == []
    assert sink.names("modified") == ["changed"] and sink.names("deleted") == ["removed"]
    assert len(sink.changes) == 2  # nothing the predecessor had already reported
    (_, old, new), = [c for c in sink.changes if c[0] == "modified"]
    assert (old["data"], new["data"]) == ({"v": "1"}, {"v": "2"})
    assert cache.get(CONFIGMAPS, namespace, "removed") is None
    assert cache.is_synced(CONFIGMAPS, namespace)


def _resumed_after_a_predecessor(api, namespace, names: list[str]) -> int:
    """Objects ``names`` listed and cached by a watcher that then stopped; the number it
    cached (the namespace's own root CA ConfigMap included)."""
    for name in names:
        make_cm(api, namespace, name)
    before = reflector(namespace, Recorder())
    thread = _run(before)
    wait_for(lambda: before.resource_version, 30, "the first list")
    _stop(before, thread)
    return len(before.known)


def test_a_resumed_watcher_reads_only_the_cached_objects_that_change(api, namespace,
                                                                     redis_client, monkeypatch):
    """No work per unchanged object on a restart: the predecessor's cache is read object by
    object as events arrive, and whole only when a relist needs it to diff against."""
    import reconcilers._watch.known as known_module

    monkeypatch.setattr(known_module, "COMPLETE_AFTER", 3600)  # this test's whole span
    cached = _resumed_after_a_predecessor(api, namespace,
                                          [f"kept-{i}" for i in range(20)] + ["changed"])
    kube.request(api, "PUT", CONFIGMAPS.path(namespace, "changed"),
                 {**kube.request(api, "GET", CONFIGMAPS.path(namespace, "changed")),
                  "data": {"v": "2"}})

    real_objects, real_get, loads, reads = cache.objects, cache.get, [], []
    monkeypatch.setattr(cache, "objects", lambda *a, **k: loads.append(a) or real_objects(*a, **k))
    monkeypatch.setattr(cache, "get", lambda gvr, ns, name: reads.append(name) or
                        real_get(gvr, ns, name))
    sink = Recorder()
    after = reflector(namespace, sink)
    thread = _run(after)
    try:
        wait_for(lambda: sink.changes, 30, "the change made meanwhile")
        (trigger, old, new), = sink.changes
        assert (trigger, old["data"], new["data"]) == ("modified", {"v": "1"}, {"v": "2"})
        assert loads == [] and reads == ["changed"]
        assert len(after.known) == cached  # what the cache-size gauge shows

        make_cm(api, namespace, "fresh")
        wait_for(lambda: sink.names("added") == ["fresh"], 30, "the new object")
        assert len(after.known) == cached + 1
        kube.request(api, "DELETE", CONFIGMAPS.path(namespace, "kept-0"))
        wait_for(lambda: sink.names("deleted") == ["kept-0"], 30, "the deletion")
        assert sink.changes[-1][1]["data"] == {"v": "1"}  # its last state, read at its event
        assert len(after.known) == cached
        assert loads == [] and reads == ["changed", "fresh", "kept-0"]

        # A relist diffs against every cached object: none of them is news.
        after.request_relist()
        wait_for(lambda: loads and not after.relist_requested.is_set(), 30, "the relist")
        threading.Event().wait(0.3)
    finally:
        _stop(after, thread)
    assert len(sink.changes) == 3
    assert len(after.known) == cached


def test_a_resumed_watcher_holds_every_object_once_its_first_second_is_past(
        api, namespace, redis_client, monkeypatch):
    """Off the restart's path the store is completed: a relist after Redis lost the cache
    then diffs against every object, as a watcher that listed does."""
    import reconcilers._watch.known as known_module

    monkeypatch.setattr(known_module, "COMPLETE_AFTER", 0)
    cached = _resumed_after_a_predecessor(api, namespace, [f"kept-{i}" for i in range(5)])
    sink = Recorder()
    after = reflector(namespace, sink)
    thread = _run(after)
    try:
        wait_for(lambda: after.resource_version, 30, "the resume")
        make_cm(api, namespace, "fresh")  # its event is past the (zero) delay
        wait_for(lambda: after.known.complete, 30, "the store completed")
        assert len(after.known) == cached + 1
        redis_client.flushdb()  # Redis restarted empty: the cache, its marker, the journal
        after.request_relist()
        wait_for(lambda: not after.relist_requested.is_set() and
                 cache.is_synced(CONFIGMAPS, namespace), 30, "the relist")
        threading.Event().wait(0.3)
    finally:
        _stop(after, thread)
    assert sink.names("added") == ["fresh"]  # the kept objects are no news to it
    assert cache.get(CONFIGMAPS, namespace, "kept-0") is not None  # the cache refilled


@pytest.mark.parametrize("why", ["the marker expired", "the cache scope changed"])
def test_a_watcher_lists_when_it_cannot_resume(api, namespace, redis_client, monkeypatch, why):
    make_cm(api, namespace, "one")
    before = reflector(namespace, Recorder())
    thread = _run(before)
    wait_for(lambda: before.resource_version, 30, "the first list")
    _stop(before, thread)
    if why == "the marker expired":
        redis_client.delete(f"operator:synced:{CONFIGMAPS.id}:{namespace}")
    lists = _lists(monkeypatch)
    after = Reflector(CONFIGMAPS, namespace, Recorder(), threading.Event(),
                      scope=CacheScope(metadata_only=why == "the cache scope changed"))
    thread = _run(after)
    try:
        wait_for(lambda: after.resource_version, 30, "the list")
    finally:
        _stop(after, thread)
    assert [q["path"] for q in lists] == [CONFIGMAPS.path(namespace)]


def _compact_etcd(stack) -> None:
    """Compact etcd's history up to now, as the api-server does every five minutes: a young
    cluster still holds revision 1, and serves a watch from it."""
    import json
    import urllib.request

    def call(verb: str, body: dict) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{stack.etcd_port}/v3/kv/{verb}",
                                         data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())

    revision = call("range", {"key": "YQ=="})["header"]["revision"]
    call("compaction", {"revision": revision, "physical": True})


def test_a_resume_point_too_old_for_the_api_server_relists(api, namespace, redis_client,
                                                           monkeypatch, stack):
    make_cm(api, namespace, "one")
    before = reflector(namespace, Recorder())
    thread = _run(before)
    wait_for(lambda: before.resource_version, 30, "the first list")
    _stop(before, thread)
    make_cm(api, namespace, "two")
    _compact_etcd(stack)
    # etcd compacted past it: "1" is gone, the watch answers 410.
    redis_client.set(f"operator:synced:{CONFIGMAPS.id}:{namespace}",
                     f"{before._stream} 1", keepttl=True)
    lists = _lists(monkeypatch)
    sink = Recorder()
    after = reflector(namespace, sink)
    thread = _run(after)
    try:
        wait_for(lambda: "two" in sink.names("added"), 30, "the object made meanwhile")
    finally:
        _stop(after, thread)
    assert len(lists) == 1 and sink.names("added") == ["two"]


# --- fencing by leader term -----------------------------------------------------------------

class Clock:
    """A candidate's monotonic clock, moved by the test: a lease runs out without waiting."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def two_terms(api, namespace):
    """A leader (term N) that pauses past its lease, and its successor (term N+1), elected on
    a real Lease with the fence in the real Redis."""
    from reconcilers._watch import leader

    lease = f"{namespace}/watcher"

    def elector(identity, clock=time.monotonic):
        return leader.LeaderElector(identity, namespace, "watcher", lease_seconds=3, api=api,
                                    clock=clock, fence=lambda n: fence.raise_fence(
                                        fence.Term(lease, n)))

    paused = elector("paused")
    paused.step()
    clock = Clock()
    successor = elector("successor", clock)
    successor.step()  # sees the paused one's Lease: waits
    assert not successor.is_leader.is_set()
    clock.now += 3.5  # the paused one renews no more; its lease runs out
    successor.step()
    assert paused.is_leader.is_set() and successor.is_leader.is_set()  # both believe it
    assert successor.term == paused.term + 1
    return fence.Term(lease, paused.term), fence.Term(lease, successor.term)


def test_a_paused_ex_leaders_write_arriving_after_its_successors_is_refused(api, namespace,
                                                                           redis_client):
    """The window of issue 34's first defect, opened on purpose: the old leader read an event
    (term N), paused, and delivers it after the new leader (term N+1) cached a newer version
    of the object. Redis refuses the old write; the cache keeps the new object."""
    old_term, new_term = two_terms(api, namespace)
    old_sink, new_sink = Recorder(), Recorder()
    old = Reflector(CONFIGMAPS, namespace, old_sink, threading.Event(), term=old_term)
    new = Reflector(CONFIGMAPS, namespace, new_sink, threading.Event(), term=new_term)
    first = make_cm(api, namespace, "x")
    second = kube.request(api, "PATCH", CONFIGMAPS.path(namespace, "x"), {"data": {"v": "2"}},
                          content_type=kube.MERGE_PATCH)

    new.handle({"type": "MODIFIED", "object": second})
    with pytest.raises(fence.StaleTerm):
        old.handle({"type": "ADDED", "object": first})  # the paused leader's late write

    cached = cache.get(CONFIGMAPS, namespace, "x")
    assert cached["metadata"]["resourceVersion"] == second["metadata"]["resourceVersion"]
    assert cached["data"] == {"v": "2"}
    assert old_sink.changes == []  # never reported: its keys come from the new leader
    assert "x" not in [p.split("/")[-1] for p in old.known]


def test_a_stream_refused_for_its_term_stops_every_stream_of_that_term(api, namespace,
                                                                       redis_client):
    old_term, _ = two_terms(api, namespace)
    stop = threading.Event()  # shared by the streams of one term, and their enqueuer
    old = Reflector(CONFIGMAPS, namespace, Recorder(), stop, term=old_term)
    thread = threading.Thread(target=old.run, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and stop.is_set()
    assert not cache.is_synced(CONFIGMAPS, namespace)  # its list wrote nothing


def test_a_relist_asked_for_while_a_list_is_in_flight_is_not_swallowed(
        api, namespace, redis_client, monkeypatch):
    """The cache was lost while a list was being read (Redis restarted mid-list): that list
    may predate the loss, so another one must follow - the request is not cleared by it."""
    r = reflector(namespace, Recorder())
    real, lists, ours = kube.request, [], CONFIGMAPS.path(namespace)

    def request(client, method, path, body=None, query=None, **kwargs):
        if method == "GET" and path == ours and "watch" not in (query or {}):
            lists.append(path)
            if len(lists) == 1:
                r.request_relist()  # as from another thread, while this list is in flight
        return real(client, method, path, body, query=query, **kwargs)

    monkeypatch.setattr(kube, "request", request)
    thread = _run(r)
    try:
        wait_for(lambda: len(lists) >= 2, 10, "a second list")
    finally:
        _stop(r, thread)


def test_a_list_writes_the_cache_and_its_marker_together_or_neither(
        api, namespace, redis_client, monkeypatch):
    """A watcher dying between the two would leave newer objects under an older position: its
    successor would resume from there and replay older events over the newer cache."""
    make_cm(api, namespace, "a")
    first = reflector(namespace, Recorder())
    first.list(api, initial=True)
    marked = cache.resume_point(CONFIGMAPS, namespace, first._stream)
    make_cm(api, namespace, "b")

    def dies(*args, **kwargs):
        raise RuntimeError("the watcher died here")

    monkeypatch.setattr(cache, "mark_synced", dies)
    second = reflector(namespace, Recorder())
    with pytest.raises(RuntimeError):
        second.list(api, initial=True)
    # Neither: the old position, and the cache as it was there.
    assert cache.resume_point(CONFIGMAPS, namespace, first._stream) == marked
    assert cache.get(CONFIGMAPS, namespace, "b") is None


def test_a_scope_reads_synced_only_once_its_lists_changes_are_reported(api, namespace,
                                                                       redis_client):
    """The start pass takes a synced stream's keys as handed over: a key reported after the
    stream turned synced would be enqueued by the pass and again by the relist, and run twice
    (``onstart``)."""
    make_cm(api, namespace, "one")
    make_cm(api, namespace, "two")
    synced_at_report: list[bool] = []
    subject = reflector(namespace, lambda trigger, old, new, change=None:
                        synced_at_report.append(bool(subject.resource_version)))
    subject.list(api, initial=True)
    assert synced_at_report and not any(synced_at_report), synced_at_report
    assert subject.resource_version

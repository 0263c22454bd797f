"""Watch streams as the watcher runs them: real api-server, Redis and PostgreSQL. (The enqueuer
alone: tests/watch/test_enqueuer.py.)"""

from __future__ import annotations

import threading

import pytest

from reconcilers._kube import cache, journal
from reconcilers._watch.enqueuer import Enqueuer
from reconcilers._watch.lifecycle import run_streams
from reconcilers._watch.streams import build_streams, replay_journal
from reconcilers.models import WatchStream, WorkItem
from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base.vocab import GVR, Owns
from tests.helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CONFIGMAPS = GVR.of("v1", "ConfigMap")


class ConfigMaps(Reconciler):
    version, kind = "v1", "ConfigMap"
    owns = [Owns("v1", "Secret")]


def test_one_stream_per_resource_and_namespace(settings):
    settings.RECONCILERS_NAMESPACES = "a, b"
    streams = build_streams([ConfigMaps], Enqueuer(threading.Event()),
                            threading.Event())
    assert sorted((s.gvr.plural, s.namespace) for s in streams) == [
        ("configmaps", "a"), ("configmaps", "b"), ("secrets", "a"), ("secrets", "b")]


def test_streams_enqueue_keys_and_relist_after_redis_loses_the_cache(
        kube, namespace, redis_client, settings):
    from kubernetes import client

    settings.RECONCILERS_NAMESPACES = namespace
    client.CoreV1Api(kube).create_namespaced_config_map(
        namespace, {"metadata": {"name": "cm"}})
    stop, done = threading.Event(), threading.Event()
    enqueuer = Enqueuer(stop)
    enqueuer.start()
    streams = build_streams([ConfigMaps], enqueuer, stop, holder="test")
    runner = threading.Thread(target=run_streams,
                              args=(streams, done.is_set, "test-watcher"), daemon=True)
    runner.start()
    try:
        wait_for(lambda: WorkItem.objects.filter(namespace=namespace, name="cm").exists(),
                 what="the ConfigMap's key in the ledger")
        wait_for(lambda: cache.is_synced(CONFIGMAPS, namespace), what="synced")
        redis_client.flushdb()  # Redis restarted empty
        wait_for(lambda: cache.get(CONFIGMAPS, namespace, "cm") is not None, timeout=15,
                 what="the cache refilled by a relist")
        assert cache.is_synced(CONFIGMAPS, namespace)
        row = wait_for(lambda: WatchStream.objects.filter(
            reconciler="configmaps", resource=CONFIGMAPS.id, connected=True).first(),
            what="the stream's status")
        assert row.holder == "test"
    finally:
        done.set()
        stop.set()
        runner.join(20)
        enqueuer.join(5)


def test_streams_relist_after_redis_went_back_to_an_older_snapshot_and_enqueue_what_it_lost(
        kube, namespace, private_redis, redis_client, settings):
    """The synced marker comes back with the snapshot, alive: without the watcher's epoch the
    stream would go on from its position in memory over a cache lacking what came since."""
    from kubernetes import client

    settings.RECONCILERS_NAMESPACES = namespace
    settings.REDIS_URL = private_redis.url  # the cache; the ledger's messages stay where they are
    core = client.CoreV1Api(kube)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "before"}})
    stop, done = threading.Event(), threading.Event()
    enqueuer = Enqueuer(stop)
    enqueuer.start()
    streams = build_streams([ConfigMaps], enqueuer, stop, holder="test")
    runner = threading.Thread(target=run_streams,
                              args=(streams, done.is_set, "test-watcher"), daemon=True)
    runner.start()
    try:
        wait_for(lambda: WorkItem.objects.filter(namespace=namespace, name="before").exists(),
                 what="the first ConfigMap's key in the ledger")
        snapshot = private_redis.save()
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "gap"}})
        wait_for(lambda: WorkItem.objects.filter(namespace=namespace, name="gap").exists(),
                 what="the key of the ConfigMap made after the snapshot")
        # As if its run had ended: a run reading the older cache would have found nothing.
        WorkItem.objects.filter(namespace=namespace, name="gap").delete()

        private_redis.restart(snapshot)

        wait_for(lambda: WorkItem.objects.filter(namespace=namespace, name="gap").exists(),
                 timeout=15, what="the lost ConfigMap's key enqueued again by a relist")
        assert cache.get(CONFIGMAPS, namespace, "gap") is not None
        wait_for(lambda: cache.is_synced(CONFIGMAPS, namespace), what="synced again")
    finally:
        done.set()
        stop.set()
        runner.join(20)
        enqueuer.join(5)


def test_a_change_cached_but_not_enqueued_when_the_watcher_died_is_replayed(
        kube, namespace, redis_client, settings):
    """The watcher dies between the cache write and the ledger write; the next one recovers."""
    from kubernetes import client

    from reconcilers._kube import kube as door

    settings.RECONCILERS_NAMESPACES = namespace
    api = door.new_api_client()
    client.CoreV1Api(kube).create_namespaced_config_map(namespace, {"metadata": {"name": "a"}})

    doomed = Enqueuer(threading.Event())  # never started: its keys die with it
    (stream, _) = sorted(build_streams([ConfigMaps], doomed, threading.Event()),
                         key=lambda s: s.gvr.plural)
    stream.reflector.list(api, initial=True)
    assert cache.get(CONFIGMAPS, namespace, "a") is not None
    assert not WorkItem.objects.filter(name="a").exists()

    # The next watcher: its relist finds the cache up to date, the journal does not forget.
    stop = threading.Event()
    enqueuer = Enqueuer(stop)
    streams = build_streams([ConfigMaps], enqueuer, stop)
    assert replay_journal(streams) >= 1
    enqueuer.start()
    for s in streams:
        s.reflector.list(api, initial=True)
    try:
        wait_for(lambda: WorkItem.objects.filter(namespace=namespace, name="a").exists(),
                 what="the replayed key in the ledger")
        wait_for(lambda: not journal.pending(), what="the journal cleared")
    finally:
        stop.set()
        enqueuer.join(5)
        api.close()


def test_a_change_no_predicate_lets_through_is_cached_but_not_journalled(
        kube, namespace, redis_client, settings, monkeypatch):
    """Only a change that may become keys needs the journal: a status write a reconciler's
    predicates ignore costs the cache write alone (no journal entry, nothing to clear)."""
    from reconcilers._kube import kube as door
    from reconcilers._base.predicates import generation_changed

    class OnlyGenerations(Reconciler):
        version, kind = "v1", "ConfigMap"
        predicates = [generation_changed]

    settings.RECONCILERS_NAMESPACES = namespace
    api = door.new_api_client()
    body = {"metadata": {"name": "a", "labels": {"v": "1"}}}
    door.request(api, "POST", CONFIGMAPS.path(namespace), body)
    stop = threading.Event()
    enqueuer = Enqueuer(stop)  # never started: what it was handed stays visible
    (stream,) = build_streams([OnlyGenerations], enqueuer, stop)
    journalled = []
    real_record = journal.record

    def record(change, pipe):
        if change.path == f"{namespace}/a":  # not the namespace's kube-root-ca.crt
            journalled.append(change.path)
        real_record(change, pipe)

    monkeypatch.setattr(journal, "record", record)
    try:
        stream.reflector.list(api, initial=True)  # a list journals what it finds, as before
        assert journalled == [f"{namespace}/a"]
        labelled = door.request(api, "PUT", CONFIGMAPS.path(namespace, "a"),
                                {**door.request(api, "GET", CONFIGMAPS.path(namespace, "a")),
                                 "metadata": {**body["metadata"], "labels": {"v": "2"}}})
        stream.reflector.handle({"type": "MODIFIED", "object": labelled})  # generation kept
        assert cache.get(CONFIGMAPS, namespace, "a")["metadata"]["labels"] == {"v": "2"}
        assert journalled == [f"{namespace}/a"]
        door.request(api, "DELETE", CONFIGMAPS.path(namespace, "a"))
        stream.reflector.handle({"type": "DELETED", "object": labelled})  # deletions pass
        assert journalled == [f"{namespace}/a", f"{namespace}/a"]
        assert stream.router.skipped == 1
    finally:
        api.close()


def test_a_childs_change_an_owns_predicate_filters_is_cached_and_reaches_the_others(
        kube, namespace, redis_client, settings, monkeypatch):
    """An owner's predicate drops its key, never the cache write: a reconciler sharing the
    stream (here the ConfigMaps' own) still gets the change, journalled; filtered for every
    handler, the change is cached alone."""
    from reconcilers._kube import kube as door
    from reconcilers._base.predicates import labels_changed
    from reconcilers._base.reconcile import Key

    class LabelReaders(Reconciler):
        version, kind = "v1", "Secret"
        owns = [Owns("v1", "ConfigMap", predicates=[labels_changed])]

    settings.RECONCILERS_NAMESPACES = namespace
    api = door.new_api_client()
    owner = door.request(api, "POST", GVR.of("v1", "Secret").path(namespace),
                         {"metadata": {"name": "owner"}})
    door.request(api, "POST", CONFIGMAPS.path(namespace), {"metadata": {
        "name": "child", "ownerReferences": [{"apiVersion": "v1", "kind": "Secret",
                                              "name": "owner", "uid": owner["metadata"]["uid"],
                                              "controller": True}]}})
    journalled = []
    real_record = journal.record

    def record(change, pipe):
        if change.path == f"{namespace}/child":
            journalled.append(change.path)
        real_record(change, pipe)

    monkeypatch.setattr(journal, "record", record)

    def annotate(stream, value: str) -> None:
        current = door.request(api, "GET", CONFIGMAPS.path(namespace, "child"))
        current["metadata"]["annotations"] = {"note": value}
        changed = door.request(api, "PUT", CONFIGMAPS.path(namespace, "child"), current)
        stream.reflector.handle({"type": "MODIFIED", "object": changed})

    try:
        for reconcilers, journals, keys in (
                ([LabelReaders, ConfigMaps], 1, {Key("configmaps", namespace, "child")}),
                ([LabelReaders], 0, set())):
            (stream,) = [s for s in build_streams(reconcilers, Enqueuer(threading.Event()),
                                                  threading.Event()) if s.gvr == CONFIGMAPS]
            put: list[Key] = []
            stream.router.put = lambda key, trigger: put.append(key)
            stream.reflector.list(api, initial=True)
            put.clear()
            journalled.clear()
            annotate(stream, str(journals))
            assert cache.get(CONFIGMAPS, namespace, "child")["metadata"]["annotations"] == {
                "note": str(journals)}
            assert len(journalled) == journals
            assert set(put) == keys
            assert (stream.router.skipped_for("secrets"),
                    stream.router.skipped_for("configmaps")) == (1, 0)
    finally:
        api.close()


def test_a_predicate_that_raises_neither_stops_the_stream_nor_loses_the_change(
        kube, namespace, redis_client, settings, caplog):
    """A bug in a user's predicate is logged and the change let through: raising out of the
    stream would stop it at that object (and again at every relist)."""
    from reconcilers._kube import kube as door
    from reconcilers._base.reconcile import Key

    def needs_labels(old, new):
        return old["metadata"]["labels"] != new["metadata"]["labels"]

    class Fragile(Reconciler):
        version, kind = "v1", "ConfigMap"
        predicates = [needs_labels]

    settings.RECONCILERS_NAMESPACES = namespace
    api = door.new_api_client()
    door.request(api, "POST", CONFIGMAPS.path(namespace), {"metadata": {"name": "bare"}})
    (stream,) = build_streams([Fragile], Enqueuer(threading.Event()), threading.Event())
    put: list[Key] = []
    stream.router.put = lambda key, trigger: put.append(key)
    try:
        stream.reflector.list(api, initial=True)
        changed = door.request(api, "PATCH", CONFIGMAPS.path(namespace, "bare"),
                               {"data": {"a": "1"}},
                               content_type="application/merge-patch+json")
        put.clear()
        stream.reflector.handle({"type": "MODIFIED", "object": changed})
        assert put == [Key("configmaps", namespace, "bare")]
        assert cache.get(CONFIGMAPS, namespace, "bare")["data"] == {"a": "1"}
        assert "predicate needs_labels raised on" in caplog.text
    finally:
        api.close()

"""The lister side of the informer on the real api-server and Redis: ``ctx.list`` by namespace,
labels and index equals an api-server LIST - from the cache the reflector keeps, through
updates, deletions and a watcher restart - and falls back to the api-server where nothing is
cached."""

from __future__ import annotations

import threading
import time

import pytest

from reconcilers._kube import kube
from reconcilers._kube.context import Context
from reconcilers._watch.reflector import Reflector
from reconcilers._base.vocab import GVR, Index
from reconcilers._base.reconcile import Key

CONFIGMAPS = GVR.of("v1", "ConfigMap")
COLOR = Index("v1", "ConfigMap", "color", lambda cm: [(cm.get("data") or {}).get("color")])


def _ctx(namespace: str, api, watched: bool = True) -> Context:
    primary = GVR.of("test.operator.local/v1", "Probe")
    return Context(Key("probes.test.operator.local", namespace, "p"), {"metadata": {}},
                   primary=primary, api=api, indexes=[COLOR],
                   watched={("v1", "ConfigMap"): CONFIGMAPS} if watched else None)


def _cm(api, namespace, name, color, tier="web"):
    return kube.request(api, "POST", CONFIGMAPS.path(namespace), {
        "metadata": {"name": name, "labels": {"tier": tier}}, "data": {"color": color}})


def _api_list(api, namespace, labels=None, color=None) -> list[tuple[str, str]]:
    query = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else None
    items = kube.request(api, "GET", CONFIGMAPS.path(namespace), query=query)["items"]
    return sorted((o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in items
                  if color is None or (o.get("data") or {}).get("color") == color)


def _names(objs) -> list[tuple[str, str]]:
    return [(o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in objs]


class Running:
    """A reflector with the color index in a thread, as the watcher runs it."""

    def __init__(self, namespace: str):
        self.stop = threading.Event()
        self.reflector = Reflector(CONFIGMAPS, namespace, lambda *a: None, self.stop,
                                   indexes={"color": COLOR})
        self.thread = threading.Thread(target=self.reflector.run, daemon=True)
        self.thread.start()

    def halt(self) -> None:
        self.reflector.abort()
        self.thread.join(10)


def _agree(ctx: Context, api, namespace: str, timeout: float = 20) -> None:
    """Every query form returns what the api-server LIST returns (once the watch caught up)."""
    deadline = time.monotonic() + timeout
    while True:
        got = {
            "all": _names(ctx.list("v1", "ConfigMap")),
            "labels": _names(ctx.list("v1", "ConfigMap", labels={"tier": "db"})),
            "red": _names(ctx.list("v1", "ConfigMap", index=("color", "red"))),
            "blue": _names(ctx.list("v1", "ConfigMap", index=("color", "blue"))),
        }
        want = {
            "all": _api_list(api, namespace),
            "labels": _api_list(api, namespace, labels={"tier": "db"}),
            "red": _api_list(api, namespace, color="red"),
            "blue": _api_list(api, namespace, color="blue"),
        }
        if got == want:
            return
        if time.monotonic() > deadline:
            assert got == want
        time.sleep(0.2)


def test_list_by_namespace_labels_and_index_equals_an_api_server_list(api, namespace,
                                                                     redis_client):
    for i, (color, tier) in enumerate([("red", "web"), ("red", "db"), ("blue", "db"),
                                       ("green", "web")]):
        _cm(api, namespace, f"cm-{i}", color, tier)
    running = Running(namespace)
    ctx = _ctx(namespace, api)
    try:
        _agree(ctx, api, namespace)
        assert [o["metadata"]["name"] for o in ctx.list("v1", "ConfigMap",
                                                         index=("color", "red"))] == [
            "cm-0", "cm-1"]
        # Updates move objects between index values; deletions take them out.
        kube.request(api, "PATCH", CONFIGMAPS.path(namespace, "cm-0"),
                     {"data": {"color": "blue"}}, content_type=kube.MERGE_PATCH)
        kube.request(api, "DELETE", CONFIGMAPS.path(namespace, "cm-1"))
        _cm(api, namespace, "cm-4", "red", "db")
        _agree(ctx, api, namespace)
    finally:
        running.halt()

    # The watch has stopped: a list still comes from the cache (it does not see this one).
    _cm(api, namespace, "cm-5", "red")
    assert "cm-5" not in [o["metadata"]["name"] for o in ctx.list("v1", "ConfigMap")]

    # A watcher restart lists again against the shared cache and refiles every index.
    kube.request(api, "PATCH", CONFIGMAPS.path(namespace, "cm-4"),
                 {"data": {"color": "green"}}, content_type=kube.MERGE_PATCH)
    running = Running(namespace)
    try:
        _agree(ctx, api, namespace)
    finally:
        running.halt()


def test_a_resource_nobody_caches_is_listed_from_the_api_server(api, namespace, redis_client):
    _cm(api, namespace, "a", "red", "db")
    _cm(api, namespace, "b", "blue", "db")
    ctx = _ctx(namespace, api, watched=False)
    assert [o["metadata"]["name"] for o in ctx.list("v1", "ConfigMap", labels={"tier": "db"},
                                                     index=("color", "red"))] == ["a"]
    assert all(o["kind"] == "ConfigMap" and "managedFields" not in o["metadata"]
               for o in ctx.list("v1", "ConfigMap"))


def test_an_index_the_reconciler_did_not_declare_is_a_clear_error(api, namespace):
    with pytest.raises(LookupError, match="no Index 'size'"):
        _ctx(namespace, api).list("v1", "ConfigMap", index=("size", "big"))


def test_a_watched_resource_is_granted_read_only_in_the_generated_role():
    from reconcilers._authoring import rbac
    from tests.operatorapp.reconcilers import ConfiguredProbeReconciler

    rules = [r for r in rbac.rules_for([ConfiguredProbeReconciler])
             if "configmaps" in r["resources"]]
    assert [sorted(r["verbs"]) for r in rules] == [["get", "list", "watch"]]


def test_an_index_over_a_resource_nobody_watches_stops_the_watcher_at_start():
    from reconcilers._authoring.reconciler import Reconciler
    from reconcilers._watch.enqueuer import Enqueuer
    from reconcilers._watch.streams import build_streams

    class Careless(Reconciler):
        group, version, kind = "test.operator.local", "v1", "Probe"
        indexes = [Index("v1", "Secret", "type", lambda s: [s.get("type")])]

    stop = threading.Event()
    with pytest.raises(ValueError, match="no reconciler watches"):
        build_streams([Careless], Enqueuer(stop), stop)


def test_one_stream_per_resource_keeps_the_indexes_and_routes_watched_changes():
    from reconcilers._watch.handlers import WATCHED
    from reconcilers._watch.enqueuer import Enqueuer
    from reconcilers._watch.streams import build_streams
    from tests.operatorapp.reconcilers import ConfiguredProbeReconciler

    stop = threading.Event()
    streams = {s.gvr.kind: s for s in build_streams([ConfiguredProbeReconciler],
                                                     Enqueuer(stop), stop)}
    assert set(streams) == {"Probe", "ConfigMap"}
    configmaps = streams["ConfigMap"]
    assert set(configmaps.reflector.indexes) == {"color"}
    (handler,) = configmaps.router.handlers
    assert handler.role == WATCHED
    cm = {"metadata": {"name": "web-config", "namespace": "ns"}}
    assert handler.keys_for(None, cm) == [Key("probes.configured.operator.local", "ns", "web")]
    assert handler.keys_for(None, {"metadata": {"name": "other", "namespace": "ns"}}) == []


def _cached_names(namespace) -> list[str]:
    from reconcilers._kube import cache

    return sorted(o["metadata"]["name"] for o in cache.objects(CONFIGMAPS, namespace).values())


def test_a_selector_scoped_cache_holds_only_what_it_selects(api, namespace, redis_client):
    from reconcilers._base.vocab import CacheScope

    _cm(api, namespace, "ours", "red", tier="db")
    _cm(api, namespace, "theirs", "red", tier="web")
    stop = threading.Event()
    reflector = Reflector(CONFIGMAPS, namespace, lambda *a: None, stop,
                          scope=CacheScope(selector="tier=db"))
    thread = threading.Thread(target=reflector.run, daemon=True)
    thread.start()
    try:
        wait = time.monotonic() + 20
        while _cached_names(namespace) != ["ours"]:
            assert time.monotonic() < wait, _cached_names(namespace)
            time.sleep(0.1)
        # An object that starts matching comes in; one that stops matching goes out.
        kube.request(api, "PATCH", CONFIGMAPS.path(namespace, "theirs"),
                     {"metadata": {"labels": {"tier": "db"}}}, content_type=kube.MERGE_PATCH)
        kube.request(api, "PATCH", CONFIGMAPS.path(namespace, "ours"),
                     {"metadata": {"labels": {"tier": "web"}}}, content_type=kube.MERGE_PATCH)
        while _cached_names(namespace) != ["theirs"]:
            assert time.monotonic() < wait, _cached_names(namespace)
            time.sleep(0.1)
        # ctx.get of an object outside the selection asks the api-server: it exists.
        ctx = Context(Key("x", namespace, "p"), {"metadata": {}}, primary=CONFIGMAPS, api=api,
                      watched={("v1", "ConfigMap"): CONFIGMAPS},
                      scopes={("v1", "ConfigMap"): CacheScope(selector="tier=db")})
        assert ctx.get("v1", "ConfigMap", "ours")["metadata"]["labels"] == {"tier": "web"}
        assert [o["metadata"]["name"] for o in ctx.list("v1", "ConfigMap")] == ["theirs"]
    finally:
        reflector.abort()
        thread.join(10)


def test_a_metadata_only_cache_holds_metadata_and_reads_get_the_whole_object(api, namespace,
                                                                           redis_client):
    from reconcilers._kube import cache
    from reconcilers._base.vocab import CacheScope

    _cm(api, namespace, "big", "red")
    scope = CacheScope(metadata_only=True)
    Reflector(CONFIGMAPS, namespace, lambda *a: None, threading.Event(),
              scope=scope).list(api, initial=True)
    cached = cache.get(CONFIGMAPS, namespace, "big")
    assert cached["kind"] == "ConfigMap" and cached["apiVersion"] == "v1"
    assert "data" not in cached and cached["metadata"]["labels"] == {"tier": "web"}
    ctx = Context(Key("x", namespace, "p"), {"metadata": {}}, primary=CONFIGMAPS, api=api,
                  watched={("v1", "ConfigMap"): CONFIGMAPS}, scopes={("v1", "ConfigMap"): scope})
    assert ctx.get("v1", "ConfigMap", "big")["data"] == {"color": "red"}


def test_two_reconcilers_caching_one_resource_differently_is_an_error_at_start():
    from reconcilers._authoring.reconciler import Reconciler
    from reconcilers._base.vocab import Owns
    from reconcilers._watch.enqueuer import Enqueuer
    from reconcilers._watch.streams import build_streams

    class A(Reconciler):
        group, version, kind = "a.example.com", "v1", "Thing"
        owns = [Owns("v1", "ConfigMap", selector="app=a")]

    class B(Reconciler):
        group, version, kind = "b.example.com", "v1", "Thing"
        owns = [Owns("v1", "ConfigMap")]

    stop = threading.Event()
    with pytest.raises(ValueError, match="cache ConfigMap differently"):
        build_streams([A, B], Enqueuer(stop), stop)


def test_an_all_namespaces_stream_rebuilds_only_its_own_index_sets(api, namespace, redis_client):
    """Two watchers sharing Redis, one for every namespace and one for a single namespace:
    the first one's relist must not drop the second one's index sets."""
    from reconcilers._kube import cache

    _cm(api, namespace, "kept", "red")
    Reflector(CONFIGMAPS, namespace, lambda *a: None, threading.Event(),
              indexes={"color": COLOR}).list(api, initial=True)
    assert cache.indexed(CONFIGMAPS, namespace, "color", "red") == {f"{namespace}/kept"}
    pipe = cache.get_redis().pipeline(transaction=True)
    cache.reset_indexes(CONFIGMAPS, None, {"color": COLOR}, pipe)  # the all-namespaces one
    pipe.execute()
    members = cache.get_redis().smembers(f"operator:idx:{CONFIGMAPS.id}:{namespace}:color:red")
    assert members == {f"{namespace}/kept".encode()}

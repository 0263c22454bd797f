"""Reads: what a run (``ctx.get``, ``ctx.list``), a ``Watches`` map function and an admission
hook read - client-go's Lister, from the shared cache where the watcher keeps a resource,
otherwise from the api-server.

The rule: a read is served from the cache only when the cache can answer it - the resource
watched and its scope synced, the object kept in full (a kind cached as metadata only is read
from the api-server), and a miss trusted only in a cache that holds the whole resource (one
narrowed by a selector may lack an object that exists). A Secret always comes from the
api-server: the cache never holds its data. What a read returns is a deep copy, never the
cached object, and a read needs no fence: only writes (``context``, ``children``) are fenced.
With an offline api (a test's fake cluster, a replay) there is no cache in front, and every
read goes to it.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable, Mapping

from reconcilers._kube import cache, kube
from reconcilers._base.vocab import GVR, CacheScope, Index, object_path


def _has_labels(obj: Mapping, labels: Mapping[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())



class Lister:
    """Reads - client-go's Lister: from the shared cache where the watcher keeps a resource,
    otherwise from the api-server. A run reads through ``ctx``; a ``Watches`` map function that
    takes a second argument gets one of these (to find the objects a change concerns)."""

    def __init__(self, api: kube.ApiClient, watched: Mapping[tuple[str, str], GVR],
                 indexes: Iterable[Index] = (),
                 scopes: Mapping[tuple[str, str], CacheScope] | None = None):
        self.api = api
        self._watched = dict(watched)
        self._indexes = {(i.api_version, i.kind, i.name): i for i in indexes}
        self._scopes = dict(scopes or {})
        # Every read and what it returned, in order, when the run's inputs are kept
        # (``replay``): ``{"read": "get"|"list", "args": [...], "result": ...}``.
        self.reads: list[dict] | None = None
        # An offline api (a test's fake cluster, a replay) has no shared cache in front of it:
        # every read goes to it.
        self._cached = not isinstance(api, kube.Offline)

    def _noted(self, read: str, args: list, result: Any) -> Any:
        if self.reads is not None:
            self.reads.append({"read": read, "args": args, "result": copy.deepcopy(result)})
        return result

    def resource(self, api_version: str, kind: str, plural: str | None = None) -> GVR:
        """The resource the watcher caches under that apiVersion and kind, or the conventional
        one."""
        return self._watched.get((api_version, kind)) or GVR.of(api_version, kind, plural)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None,
            plural: str | None = None) -> dict | None:
        """The object (``namespace``: its namespace; none for a cluster-scoped one), or None
        when it does not exist. A deep copy: safe to modify.

        From the cache when the watcher keeps that resource in full; a kind cached as
        metadata only is read from the api-server, and so is a miss in a cache narrowed by a
        selector (the object may exist outside it). A Secret always comes from the
        api-server: the cache never holds its data."""
        return self._noted("get", [api_version, kind, name, namespace, plural],
                           self._get(api_version, kind, name, namespace, plural))

    def _get(self, api_version: str, kind: str, name: str, namespace: str | None,
             plural: str | None) -> dict | None:
        gvr = self.resource(api_version, kind, plural)
        ns = namespace or ""
        scope = ns if gvr.namespaced else None
        kept = self._scopes.get((api_version, kind), CacheScope())
        if (self._cached and (api_version, kind) in self._watched and not kept.metadata_only
                and not is_secret(gvr) and cache.is_synced(gvr, scope)):
            found = cache.get(gvr, scope, name)
            if found is not None or kept.whole:
                return found
        return kube.get_or_none(self.api, gvr.path(ns, name))

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             labels: Mapping[str, str] | None = None, index: tuple[str, str] | None = None,
             plural: str | None = None) -> list[dict]:
        """Objects of a kind, sorted by namespace and name - client-go's Lister with its
        Indexer. ``namespace``: one namespace (``""`` or None: all);
        ``labels``: each label must have that value; ``index``: ``(name, value)`` of one of
        this reconciler's ``Index`` declarations.

        From the shared cache when the watcher keeps that resource (and the index) for the
        scope asked; otherwise one LIST from the api-server, filtered the same way. A cache
        narrowed by a selector lists what it holds, and one of metadata only lists metadata
        (as controller-runtime's scoped caches do). Deep copies: safe to modify."""
        return self._noted("list", [api_version, kind, namespace,
                                    dict(labels) if labels else None,
                                    list(index) if index else None, plural],
                           self._list(api_version, kind, namespace, labels, index, plural))

    def _list(self, api_version: str, kind: str, namespace: str | None,
              labels: Mapping[str, str] | None, index: tuple[str, str] | None,
              plural: str | None) -> list[dict]:
        gvr = self.resource(api_version, kind, plural)
        ns = namespace or ""
        scope = (ns or None) if gvr.namespaced else None
        declared = None
        if index is not None:
            declared = self._indexes.get((api_version, kind, index[0]))
            if declared is None:
                raise LookupError(f"no Index {index[0]!r} over {api_version} {kind} is "
                                  f"declared on this reconciler")
        objs = self._list_cached(gvr, scope, index) \
            if self._cached and (api_version, kind) in self._watched and not is_secret(gvr) \
            else None
        if objs is None:
            query = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} \
                if labels else None
            items = kube.request(self.api, "GET", gvr.path(scope), query=query).get("items")
            # As the cache holds them: with apiVersion and kind, sanitised (a Secret keeps
            # its data: the run asked for it).
            objs = [{"apiVersion": gvr.api_version, "kind": gvr.kind, **o} for o in items or []]
            if not is_secret(gvr):
                objs = [cache.sanitize(o) for o in objs]
            if declared is not None:
                objs = [o for o in objs if index[1] in declared.values(o)]
        if labels:
            objs = [o for o in objs if _has_labels(o, labels)]
        return sorted(objs, key=lambda o: object_path(o["metadata"].get("namespace"),
                                                      o["metadata"]["name"]))

    def _list_cached(self, gvr: GVR, scope: str | None,
                     index: tuple[str, str] | None) -> list[dict] | None:
        if index is not None:
            paths = cache.indexed(gvr, scope, *index)
            return None if paths is None else cache.get_many(gvr, paths)
        if not cache.is_synced(gvr, scope):
            return None
        return list(cache.objects(gvr, scope).values())



def is_secret(gvr: GVR) -> bool:
    """A Secret: the cache never holds its data, so it is read from the api-server."""
    return gvr.group == "" and gvr.kind == "Secret"

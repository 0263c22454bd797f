"""The shared informer cache in Redis: the watcher writes objects, reconcilers read them.

Workers are separate processes, so client-go's in-memory Indexer becomes one Redis hash per
watched resource (``operator:obj:<group>/<version>/<plural>``, field ``<namespace>/<name>``).
``operator:synced:<resource>:<namespace>`` (``*`` for a stream of every namespace) marks a
scope whose initial list is complete: only then does a cache miss there mean "deleted". It
holds the resourceVersion the cache is at, so a restarted watcher resumes instead of listing.
Indexes (``Index``) are sets per stream scope, ``operator:idx:<resource>:<scope>:<index>:<value>``
of object fields, written in the same transaction as the objects; ``operator:indexes:<resource>:
<scope>`` names the indexes that scope's watcher keeps. If
Redis restarts empty the markers are gone too, readers fall back to the api-server, and the
watcher notices and relists; if it comes back holding older data, markers included, the
watcher notices through its ``epoch`` and relists too. Expectations (``ctx.expectations``) are sets
``operator:expect:<name>``.

Only this module knows these keys. Two neighbours own theirs beside them, in the same Redis and
written in the same batches: ``fence`` (``operator:term:<lease>``, the leader's term every
watcher write is checked against) and ``journal`` (``operator:pending``, the changes cached
but not yet in the work queue).

Objects are stored sanitised: no ``managedFields``, no last-applied annotation, and never the
data of a Secret.
"""

from __future__ import annotations

import json
from typing import Iterable, Mapping

import redis
from django.conf import settings

from reconcilers._base.once import per_process
from reconcilers._base.vocab import GVR, object_path

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


@per_process
def client_for(url: str) -> redis.Redis:
    """One client (connection pool) per process and URL."""
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5,
                                health_check_interval=30)


def get_redis() -> redis.Redis:
    """One connection pool per process and URL (redis-py pools are thread-safe)."""
    return client_for(settings.REDIS_URL)


def Batch(transaction: bool = True) -> redis.client.Pipeline:  # noqa: N802 - a constructor
    """Commands sent in one round trip - with ``transaction``, applied together (MULTI ...
    EXEC): a redis-py pipeline of the process's client. The watcher writes one per event and
    every run reads through one. A dropped connection is replaced and the batch sent again
    (redis-py's retry): every write here sets a value or membership (never increments), so
    applying a batch twice leaves what once does."""
    return get_redis().pipeline(transaction=transaction)


def _objects_key(gvr: GVR) -> str:
    return f"operator:obj:{gvr.id}"


def _synced_key(gvr: GVR, namespace: str | None) -> str:
    return f"operator:synced:{gvr.id}:{namespace or '*'}"


field = object_path  # the hash field of an object: ``<namespace>/<name>``


def sanitize(obj: Mapping) -> dict:
    """What may be cached, shown or recorded of an API object."""
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    out["metadata"] = meta
    if out.get("kind") == "Secret":
        out.pop("data", None)
        out.pop("stringData", None)
    return out


def put_many(gvr: GVR, objs: Iterable[Mapping],
             pipe: redis.client.Pipeline | None = None) -> None:
    mapping = {}
    for obj in objs:
        meta = obj["metadata"]
        mapping[field(meta.get("namespace"), meta["name"])] = json.dumps(
            sanitize(obj), separators=(",", ":"))
    if mapping:
        (pipe or get_redis()).hset(_objects_key(gvr), mapping=mapping)


def delete(gvr: GVR, namespace: str | None, name: str,
           pipe: redis.client.Pipeline | None = None) -> None:
    (pipe or get_redis()).hdel(_objects_key(gvr), field(namespace, name))


def get(gvr: GVR, namespace: str | None, name: str) -> dict | None:
    raw = get_redis().hget(_objects_key(gvr), field(namespace, name))
    return json.loads(raw) if raw is not None else None


def fields(gvr: GVR) -> set[str]:
    return {f.decode() for f in get_redis().hkeys(_objects_key(gvr))}


def count(gvr: GVR, namespace: str | None = None) -> int:
    """How many objects are cached for ``gvr`` (in ``namespace`` if given) without reading
    them: one HLEN for every namespace; the hash's field names, for one."""
    if namespace is None:
        return get_redis().hlen(_objects_key(gvr))
    prefix = f"{namespace}/"
    return sum(1 for f in fields(gvr) if f.startswith(prefix))


def objects(gvr: GVR, namespace: str | None = None) -> dict[str, dict]:
    """``{field: object}`` of everything cached for ``gvr`` (in ``namespace`` if given): what a
    watcher knew before it restarted, for its relist diff."""
    match = f"{namespace}/*" if namespace else None
    return {k.decode(): json.loads(v)
            for k, v in get_redis().hscan_iter(_objects_key(gvr), match=match, count=1000)}


# --- indexes ------------------------------------------------------------------------------


def _index_key(gvr: GVR, scope: str | None, index: str, value: str) -> str:
    return f"operator:idx:{gvr.id}:{scope or '*'}:{index}:{value}"


def _indexes_key(gvr: GVR, scope: str | None) -> str:
    return f"operator:indexes:{gvr.id}:{scope or '*'}"


def reindex(gvr: GVR, scope: str | None, path: str, old: Mapping[str, set[str]],
            new: Mapping[str, set[str]], pipe: redis.client.Pipeline) -> None:
    """File ``path`` under its new values of each index, and out of the ones it left."""
    for index in set(old) | set(new):
        before, after = old.get(index, set()), new.get(index, set())
        for value in before - after:
            pipe.srem(_index_key(gvr, scope, index, value), path)
        for value in after - before:
            pipe.sadd(_index_key(gvr, scope, index, value), path)


def reset_indexes(gvr: GVR, scope: str | None, names: Iterable[str],
                  pipe: redis.client.Pipeline) -> None:
    """Drop every index set of this scope (in ``pipe``) and record which indexes it keeps from
    now on: a watcher that starts with other index functions never serves stale sets."""
    # "*" names the all-namespaces scope; in a SCAN pattern it must be matched literally.
    pattern = f"operator:idx:{_glob_escape(gvr.id)}:{_glob_escape(scope or '*')}:*"
    stale = [k for k in get_redis().scan_iter(match=pattern, count=1000)]
    for start in range(0, len(stale), 1000):
        pipe.delete(*stale[start:start + 1000])
    pipe.delete(_indexes_key(gvr, scope))
    names = list(names)
    if names:
        pipe.sadd(_indexes_key(gvr, scope), *names)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def indexed(gvr: GVR, namespace: str | None, index: str, value: str) -> set[str] | None:
    """The fields filed under ``index=value`` (in ``namespace`` if given), from a synced scope
    whose watcher keeps that index; None when no such scope exists (ask the api-server)."""
    r = get_redis()
    scopes = [None] + ([namespace] if namespace else [])
    for scope in scopes:
        if r.exists(_synced_key(gvr, scope)) and r.sismember(_indexes_key(gvr, scope), index):
            members = {m.decode() for m in r.smembers(_index_key(gvr, scope, index, value))}
            if namespace:
                members = {m for m in members if m.startswith(f"{namespace}/")}
            return members
    return None


def get_many(gvr: GVR, paths: Iterable[str]) -> list[dict]:
    """The cached objects at ``paths`` (fields); ones gone meanwhile are left out."""
    paths = sorted(paths)
    if not paths:
        return []
    raws = get_redis().hmget(_objects_key(gvr), paths)
    return [json.loads(raw) for raw in raws if raw is not None]


# --- expectations (``ctx.expectations``) ----------------------------------------------------

EXPECTATIONS_TTL = 300  # client-go's ExpectationsTimeout


def expect(name: str, created: Iterable[str], deleted: Iterable[str]) -> None:
    fields_ = [f"+{n}" for n in created] + [f"-{n}" for n in deleted]
    if not fields_:
        return
    key = f"operator:expect:{name}"
    pipe = get_redis().pipeline(transaction=True)
    pipe.sadd(key, *fields_)
    pipe.expire(key, EXPECTATIONS_TTL)
    pipe.execute()


def expectations_met(name: str, present: set[str]) -> bool:
    """True when every expected creation is in ``present`` and no expected deletion is; the
    expectations are then forgotten."""
    key = f"operator:expect:{name}"
    r = get_redis()
    for item in r.smembers(key):
        sign, child = item.decode()[0], item.decode()[1:]
        if (sign == "+") != (child in present):
            return False
    r.delete(key)
    return True


# A synced marker lives this long unless its watcher keeps it (``keep_synced``): with no
# watcher running, the cache stops being trusted and readers go to the api-server.
SYNCED_TTL = 60


def mark_synced(gvr: GVR, namespace: str | None, resource_version: str,
                stream: str = "", pipe: redis.client.Pipeline | None = None) -> None:
    """The scope is listed. The marker holds where its stream stands (``<stream>
    <resourceVersion>``, moved by ``advance``), for a successor to resume from."""
    (pipe or get_redis()).set(_synced_key(gvr, namespace), f"{stream} {resource_version}",
                              ex=SYNCED_TTL)


def advance(gvr: GVR, namespace: str | None, resource_version: str, stream: str = "",
            pipe: redis.client.Pipeline | None = None) -> None:
    """Move the stream's position, in the transaction that applies the change to the cache:
    the position never runs ahead of the cache or behind it. An expired marker stays expired."""
    (pipe or get_redis()).set(_synced_key(gvr, namespace), f"{stream} {resource_version}",
                              xx=True, keepttl=True)


def resume_point(gvr: GVR, namespace: str | None, stream: str) -> str | None:
    """The resourceVersion a watcher of the same ``stream`` (its cache scope) stopped at,
    while its marker lives; None means list."""
    raw = get_redis().get(_synced_key(gvr, namespace))
    if raw is None:
        return None
    kept, _, resource_version = raw.decode().partition(" ")
    return resource_version if kept == stream and resource_version else None


def drop_synced(gvr: GVR, namespace: str | None) -> bool:
    """Forget that ``namespace`` (None: every namespace) is listed: runs read the api-server
    there until a stream lists it again (``scopes``: nobody keeps it any more; ``lifecycle``:
    Redis went back in time). True when the marker was there."""
    return bool(get_redis().delete(_synced_key(gvr, namespace)))


def keep_synced(gvr: GVR, namespace: str | None) -> bool:
    """Extend the marker; False when it is gone (Redis lost the cache): relist."""
    return bool(get_redis().expire(_synced_key(gvr, namespace), SYNCED_TTL))


def is_synced(gvr: GVR, namespace: str | None = None) -> bool:
    """Whether a miss in ``namespace`` means "deleted": its scope (or all namespaces) is
    listed. Without ``namespace``, only a stream of every namespace counts."""
    return bool(get_redis().exists(*_synced_keys(gvr, namespace)))


def _synced_keys(gvr: GVR, namespace: str | None) -> list[str]:
    keys = [_synced_key(gvr, None)]
    if namespace:
        keys.append(_synced_key(gvr, namespace))
    return keys


def get_if_synced(gvr: GVR, namespace: str | None, name: str) -> tuple[bool, dict | None]:
    """``(is_synced, get)`` in one round trip: what a run asks before every reconcile."""
    batch = Batch(transaction=False)
    batch.exists(*_synced_keys(gvr, namespace))
    batch.hget(_objects_key(gvr), field(namespace, name))
    synced, raw = batch.execute()
    return bool(synced), (json.loads(raw) if raw is not None else None)

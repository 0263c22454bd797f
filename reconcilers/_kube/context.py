"""``ctx``: what a reconcile gets besides the object - reads, child writes, status, events.

Reads come from the shared cache when the resource is watched (and its cache is synced),
otherwise from the api-server. Writes go to the api-server and carry the resourceVersion read,
so a write based on a stale copy fails with 409 Conflict and the key is retried - client-go's
"read from the cache, write to the api-server". Nothing here mutates a cached object.

Every write ``ctx`` makes is fenced by the run's hold on its key (``fence``), twice:

- Before it is sent, the claim is checked: refused once the run was abandoned (its key
  released for a retry) or its lease may have passed, and otherwise bounded by what is left
  of the lease - the call's own timeout, and the api-server's (its ``timeout`` parameter), so
  neither waits past it.
- A write based on a copy the run read carries that copy's resourceVersion, and the
  api-server refuses it (409) if the object changed since: the status and finalizer patches,
  ``adopt``, ``create_or_update``'s patch, ``apply`` of a child that exists (its uid and
  resourceVersion in the applied body) and ``delete`` (the same, as preconditions). So a
  run stopped between its check and its write - a paused process, a request held in the
  network, an abandoned thread's write in flight - cannot overwrite what a run that took its
  key over wrote. ``apply`` and ``delete`` go once more on a fresh read when refused so,
  through the check again (``_as_read``): a run that holds its key writes as before, one
  that does not is refused.

Left with the check alone: a create (POST: the api-server refuses one whose name exists, the
only condition a create can have), ``apply`` of a child that did not exist when read,
``patch`` without a ``metadata.resourceVersion`` in its body, ``request`` without one of the
api-server's preconditions, and Events (a record of what happened, not state). A write sent
before the claim ended may still land after it, on an object no successor wrote since it was
read. Writes a reconciler makes past ``ctx`` (its own client, ``ctx.api`` directly) are not
fenced at all: make them through ``ctx.request``.
"""

from __future__ import annotations

import base64
import copy
import logging
import math
import time
from typing import Any, Callable, Iterable, Mapping

from reconcilers._kube import cache, events, kube
from reconcilers._base.capability_levels import ACTIONS
from reconcilers._base.reconcile import Key, TemporaryError
from reconcilers._base.vocab import GVR, CacheScope, Index, object_path, rfc3339


class NotOwnedError(TemporaryError):
    """A child with the wanted name exists but another controller (or nobody) owns it."""


def is_subset(desired: Any, actual: Any) -> bool:
    """True when every field of ``desired`` already has that value in ``actual``."""
    if isinstance(desired, Mapping):
        return isinstance(actual, Mapping) and all(
            k in actual and is_subset(v, actual[k]) for k, v in desired.items())
    return desired == actual


def _has_labels(obj: Mapping, labels: Mapping[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


def controller_of(obj: Mapping) -> Mapping | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


# fence(): raises when the run may no longer write; otherwise the seconds its writes may still
# take (None: no bound).
Fence = Callable[[], "float | None"]


def fence_until(check: Callable[[], None], held_until: float) -> Fence:
    """The fence of a run that holds its key until ``held_until`` (local monotonic time):
    ``check`` raises once the hold is gone; otherwise the seconds left until then (None for
    a hold without end)."""

    def fence() -> float | None:
        check()
        if held_until == math.inf:
            return None
        left = held_until - time.monotonic()
        if left <= 0:
            check()  # the hold ran out since: raises now
        return max(left, 0.001)

    return fence


def _as_of(desired: dict, seen: Mapping | None) -> dict:
    """A server-side apply body conditional on ``seen``: its uid and resourceVersion in the
    body make the api-server refuse the apply (409) if the object changed since, or was
    deleted (else the apply would make it again). Without ``seen`` (the object did not exist
    when read) the apply is unconditional: Kubernetes has no precondition "does not exist
    yet" for an apply."""
    meta = (seen or {}).get("metadata") or {}
    condition = {k: meta[k] for k in ("uid", "resourceVersion") if meta.get(k)}
    return {**desired, "metadata": {**desired["metadata"], **condition}} if condition \
        else desired


def _delete_options(seen: Mapping | None) -> dict | None:
    """DeleteOptions whose preconditions are ``seen``'s uid and resourceVersion (None: an
    unconditional delete, for an object the run did not read)."""
    meta = (seen or {}).get("metadata") or {}
    preconditions = {k: meta[k] for k in ("uid", "resourceVersion") if meta.get(k)}
    if not preconditions:
        return None
    return {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}


def _within(timeout: float | tuple[float, float], left: float) -> tuple[float, float]:
    """A call's ``(connect, read)`` timeout cut so that the two together end within
    ``left`` seconds."""
    connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
    connect = min(connect, left / 2)
    return connect, min(read, left - connect)


class KeyLogger(logging.LoggerAdapter):
    """A logger whose every line names the object key (and carries it as ``record.key``)."""

    def __init__(self, logger: logging.Logger, key: Key):
        super().__init__(logger, {"key": str(key)})

    def process(self, msg, kwargs):
        kwargs["extra"] = {**self.extra, **(kwargs.get("extra") or {})}
        return f"[{self.extra['key']}] {msg}", kwargs


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
                and not _is_secret(gvr) and cache.is_synced(gvr, scope)):
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
            if self._cached and (api_version, kind) in self._watched and not _is_secret(gvr) \
            else None
        if objs is None:
            query = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} \
                if labels else None
            items = kube.request(self.api, "GET", gvr.path(scope), query=query).get("items")
            # As the cache holds them: with apiVersion and kind, sanitised (a Secret keeps
            # its data: the run asked for it).
            objs = [{"apiVersion": gvr.api_version, "kind": gvr.kind, **o} for o in items or []]
            if not _is_secret(gvr):
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


def _is_secret(gvr: GVR) -> bool:
    return gvr.group == "" and gvr.kind == "Secret"


def _secret_data(desired: dict) -> dict:
    """A Secret's ``stringData`` as ``data`` (base64), as the api-server stores it: what
    exists can then be compared with what is wanted, and an unchanged Secret is not
    written again."""
    strings = desired.pop("stringData", None)
    if strings:
        desired["data"] = {**(desired.get("data") or {}),
                           **{k: base64.b64encode(str(v).encode()).decode()
                              for k, v in strings.items()}}
    return desired


class Expectations:
    """What a run did to children that the cache may not show yet.

    ``expect(created=names, deleted=names)`` after the writes; ``met(present_names)`` at the
    start of the next run: False while a created child is still missing from what it listed,
    or a deleted one still there - then act later (``Result.after(...)``) rather than on a
    stale count. Met (or expired after 5 minutes, as client-go's) forgets them.
    """

    def __init__(self, name: str):
        self.name = name

    def expect(self, created: Iterable[str] = (), deleted: Iterable[str] = ()) -> None:
        cache.expect(self.name, created, deleted)

    def met(self, present: Iterable[str]) -> bool:
        return cache.expectations_met(self.name, set(present))


class Context:
    """Per-run helpers. ``ctx.log`` is a logger bound to the key."""

    def __init__(self, key: Key, obj: dict, *, primary: GVR,
                 watched: Mapping[tuple[str, str], GVR] | None = None,
                 api: kube.ApiClient | None = None, fence: Fence | None = None,
                 indexes: Iterable[Index] = (),
                 scopes: Mapping[tuple[str, str], CacheScope] | None = None):
        """``watched``: the resources the watcher caches for this reconciler, by
        ``(apiVersion, kind)``; reads of those come from the shared cache. ``fence`` raises
        when this run may no longer write (its key's lease ran out), and otherwise returns
        how many seconds a write may still take (``fence_until``). ``indexes``: the
        reconciler's ``Index`` declarations, for ``list(index=...)``. ``scopes``: what the
        watcher caches of each watched resource (default: everything, in full)."""
        self._fence = fence or (lambda: None)
        self.key = key
        self.obj = obj
        self.api = api or kube.api_client()
        self.primary = primary
        self.log = KeyLogger(logging.getLogger(f"reconcilers.{key.reconciler}"), key)
        self.events: list[dict] = []
        # Every write the run made, ``(method, path, body)``, in order (reconcilers.testing
        # shows them to a test).
        self.writes: list[tuple[str, str, Any]] = []
        # Children this run created or changed (a no-op apply is not a change).
        self.changed_children: list[str] = []
        # Capability actions the reconciler reported (``capability``).
        self.capabilities: list[dict] = []
        self.lister = Lister(self.api, watched or {(primary.api_version, primary.kind): primary},
                             indexes, scopes)
        self._conditions: dict[str, dict] = {}

    def _write(self, method: str, path: str, body: Any, **kwargs) -> dict:
        """Every write of a run: fenced first, so a run past its lease never acts, and given
        no more time than its lease has left - checked, then a 30 s call, could land long
        after another run took the key."""
        left = self._fence()
        if left is not None:
            kwargs["timeout"] = _within(kwargs.get("timeout", 30), left)
            # The api-server's own deadline for the call (its request timeout filter).
            kwargs["query"] = {**(kwargs.get("query") or {}), "timeout": f"{left:.3f}s"}
        result = kube.request(self.api, method, path, body, **kwargs)
        self.writes.append((method, path, body))
        return result

    def request(self, method: str, path: str, body: Any = None, **kwargs) -> dict:
        """Any other api-server write (``kube.request``'s arguments: ``query``,
        ``content_type``...), fenced like ``ctx``'s own: refused once the run's lease may be
        gone, and bounded by what is left of it. Use it rather than ``ctx.api`` for writes
        ``ctx`` has no helper for; reads need no fence."""
        return self._write(method, path, body, **kwargs)

    # --- reads ---------------------------------------------------------------------------

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None,
            plural: str | None = None) -> dict | None:
        """The object (in this object's namespace unless ``namespace`` says otherwise), or
        None when it does not exist; see ``Lister.get``."""
        ns = namespace if namespace is not None else self.key.namespace
        return self.lister.get(api_version, kind, name, ns, plural)

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             labels: Mapping[str, str] | None = None, index: tuple[str, str] | None = None,
             plural: str | None = None) -> list[dict]:
        """Objects of a kind - in this object's namespace by default (``""``: all) - with
        these ``labels``, filed under ``index=(name, value)``; see ``Lister.list``."""
        ns = namespace if namespace is not None else self.key.namespace
        return self.lister.list(api_version, kind, ns, labels=labels, index=index,
                                plural=plural)

    # --- children ------------------------------------------------------------------------

    def owner_reference(self) -> dict:
        meta = self.obj["metadata"]
        return {"apiVersion": self.primary.api_version, "kind": self.primary.kind,
                "name": meta["name"], "uid": meta["uid"], "controller": True,
                "blockOwnerDeletion": True}

    def _child(self, desired: dict, plural: str | None) -> tuple[dict, GVR, dict | None]:
        """``desired`` completed (namespace, this object as controller owner), its resource,
        and the child as it exists now (None when it does not)."""
        desired = copy.deepcopy(desired)
        meta = desired.setdefault("metadata", {})
        gvr = self.lister.resource(desired["apiVersion"], desired["kind"], plural)
        if _is_secret(gvr):
            desired = _secret_data(desired)
        if gvr.namespaced:
            meta.setdefault("namespace", self.key.namespace)
        meta["ownerReferences"] = [self.owner_reference()]
        existing = self.get(desired["apiVersion"], desired["kind"], meta["name"],
                            meta.get("namespace"), plural)
        return desired, gvr, existing

    def create_or_update(self, desired: dict, plural: str | None = None) -> dict:
        """Make a child match ``desired``, with this object as its controller owner.

        Creates it when missing; patches it only when a field of ``desired`` differs (no write
        when nothing changed); raises ``NotOwnedError`` for a same-named object this object
        does not control (the caller decides whether to emit an event).
        """
        desired, gvr, existing = self._child(desired, plural)
        meta = desired["metadata"]
        if existing is None:
            try:
                return self._changed(self._write("POST", gvr.path(meta.get("namespace")),
                                                 desired))
            except kube.ApiError as e:
                if not e.conflict:
                    raise
                existing = kube.request(self.api, "GET",
                                        gvr.path(meta.get("namespace"), meta["name"]))
        self._check_owned(existing, desired)
        wanted = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "status")}
        wanted_meta = {k: v for k, v in meta.items()
                       if k in ("labels", "annotations", "ownerReferences")}
        wanted["metadata"] = wanted_meta
        if is_subset(wanted, existing):
            return existing
        wanted["metadata"] = {**wanted_meta,
                              "resourceVersion": existing["metadata"]["resourceVersion"]}
        return self._changed(self._write("PATCH", gvr.path(meta.get("namespace"), meta["name"]),
                                         wanted, content_type=kube.MERGE_PATCH))

    def apply(self, desired: dict, plural: str | None = None, force: bool = False) -> dict:
        """Server-side apply a child: ``desired`` is the whole intent of this reconciler (its
        field manager is the reconciler's name), with this object as its controller owner.

        Unlike ``create_or_update``, a field left out of ``desired`` that this reconciler set
        before is removed from the child, and fields other managers own are kept - other
        owner references included. ``force``: take over fields another manager set (a 409
        conflict otherwise, retried like any error) - what controllers usually want for the
        fields they own; see the README. Raises ``NotOwnedError`` for a same-named object
        another controller (or nobody) controls. One PATCH per call: the api-server writes
        nothing when nothing changed.

        An apply is declarative and needs no resourceVersion, yet this one carries the
        child's as read (and its uid): it is the only way the api-server can refuse the
        apply of a run stopped after its fence check, once a run that took its key over
        wrote the child. A run that holds its key never fails for it - refused for a change
        made since its read, it reads again and applies once more (``_as_read``), so the
        apply means what it meant without the condition, at the cost of a read and a second
        PATCH when someone wrote in between."""
        desired, gvr, existing = self._child(desired, plural)
        meta = desired["metadata"]
        path = gvr.path(meta.get("namespace"), meta["name"])
        query = {"fieldManager": self.key.reconciler[:128]}
        if force:
            query["force"] = "true"

        def send(seen: dict | None) -> dict:
            if seen is not None:
                self._check_owned(seen, desired)
            return self._write("PATCH", path, _as_of(desired, seen), query=query,
                               content_type=kube.APPLY_PATCH)

        applied, existing = self._as_read(send, existing, path)
        before = ((existing or {}).get("metadata") or {}).get("resourceVersion")
        if applied["metadata"].get("resourceVersion") != before:
            self._changed(applied)
        return applied

    def _changed(self, child: dict) -> dict:
        meta = child.get("metadata") or {}
        self.changed_children.append(f"{child.get('kind', '')}/{meta.get('name', '')}")
        return child

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None,
               plural: str | None = None) -> bool:
        """Delete an object (e.g. a child no longer wanted); False when it was already gone.

        Conditional on the copy this run reads of it (its uid and resourceVersion, as
        ``_as_read`` says): a same-named successor, or a change made since by a run that took
        the key over, is never deleted by this run."""
        gvr = self.lister.resource(api_version, kind, plural)
        ns = namespace if namespace is not None else self.key.namespace
        path = gvr.path(ns if gvr.namespaced else None, name)

        def send(seen: dict | None) -> dict:
            return self._write("DELETE", path, _delete_options(seen))

        try:
            self._as_read(send, self.get(api_version, kind, name, ns, plural), path)
        except kube.ApiError as e:
            if e.gone:
                return False
            raise
        return True

    def _as_read(self, send: Callable[[dict | None], dict], seen: dict | None,
                 path: str) -> tuple[dict, dict | None]:
        """``send(seen)``: a write conditional on ``seen``, the copy of the object the run
        read (None: it read none, and the write is not conditional). What it returns, and the
        copy it was finally conditional on.

        The condition is the api-server's own (the copy's resourceVersion): the fence's check
        comes before the write is sent, and a run paused between the two - a stopped process,
        a request held in the network, an abandoned thread's write already in flight - must
        not land after a run that took its key over wrote the object. A write refused
        because the object changed since it was read goes once more, on a fresh read from
        the api-server, and that second write passes the fence first: a run that still holds
        its key writes as it would have without the condition (a cache a moment behind, or
        another writer in between, costs a read and a write, not a retry of the run), and one
        that no longer holds it is refused there."""
        try:
            return send(seen), seen
        except kube.ApiError as e:
            if seen is None or not e.changed_since_read:
                raise
        fresh = kube.get_or_none(self.api, path)
        return send(fresh), fresh

    def patch(self, api_version: str, kind: str, name: str, body: dict,
              namespace: str | None = None, plural: str | None = None) -> dict:
        """Merge-patch any object. Put ``metadata.resourceVersion`` in ``body`` to make the
        write conditional on the copy you read (409 if it changed since, retried)."""
        gvr = self.lister.resource(api_version, kind, plural)
        ns = namespace if namespace is not None else self.key.namespace
        return self._write("PATCH", gvr.path(ns if gvr.namespaced else None, name), body,
                           content_type=kube.MERGE_PATCH)

    def adopt(self, orphan: dict) -> dict:
        """Make this object the controller owner of ``orphan`` (an object nobody controls that
        matches what this object selects, as a ReplicaSet adopts Pods). Conditional on the
        copy given: if anyone changed or adopted it since, the write fails with 409 and the
        key is retried with a fresh read."""
        if controller_of(orphan) is not None:
            raise NotOwnedError(f"{orphan.get('kind', 'object')} "
                                f"{orphan['metadata']['name']} already has a controller")
        meta = orphan["metadata"]
        refs = [*(meta.get("ownerReferences") or []), self.owner_reference()]
        return self._changed(self.patch(
            orphan.get("apiVersion", "v1"), orphan["kind"], meta["name"],
            {"metadata": {"ownerReferences": refs,
                          "resourceVersion": meta["resourceVersion"]}},
            namespace=meta.get("namespace")))

    def expectations(self, what: str) -> "Expectations":
        """client-go's ControllerExpectations for this object: the children this run creates
        or deletes, remembered (in Redis, for 5 minutes) until the watch shows them, so the
        next run - which reads the cache - does not count a creation twice. See
        ``Expectations``."""
        if isinstance(self.api, kube.Offline):
            raise NotImplementedError(
                "ctx.expectations keeps its state in Redis, beside the watcher's cache; a fake "
                "cluster (or a replay) does not model it: test this reconciler against the "
                "real control plane")
        return Expectations(f"{self.key}:{what}")

    def _check_owned(self, existing: Mapping, desired: Mapping) -> None:
        ref = controller_of(existing)
        if ref is None or ref.get("uid") != self.obj["metadata"]["uid"]:
            raise NotOwnedError(
                f'Resource "{desired["metadata"]["name"]}" already exists and is not managed '
                f"by {self.primary.kind}"
            )

    # --- capability evidence -------------------------------------------------------------------

    def capability(self, action: str, detail: str = "") -> None:
        """Say that this run did a capability action - ``upgrade`` (the operand to a new
        version), ``backup``, ``restore``, ``failover``, ``failback``, ``scale-members``,
        ``auto-scaling``, ``auto-tuning`` - with what it did in ``detail``. Kept with the run
        in history; a successful run that reports one is the evidence for its capability
        level (see the admin's Reconcilers page). Call it where the action happens, not on
        every run."""
        if action not in ACTIONS:
            raise ValueError(f"unknown capability action {action!r}; one of: "
                             f"{', '.join(sorted(ACTIONS))}")
        self.capabilities.append({"action": action, "detail": str(detail)[:500]})

    # --- status ----------------------------------------------------------------------------

    def set_condition(self, type_: str, status: bool | str, reason: str, message: str = "") -> None:
        """A metav1.Condition to write with the next ``patch_status``.

        ``lastTransitionTime`` changes only when the status flips, as the convention requires.
        """
        status_str = status if isinstance(status, str) else ("True" if status else "False")
        old = {c.get("type"): c for c in (self.obj.get("status") or {}).get("conditions") or []}
        previous = old.get(type_)
        changed = previous is None or previous.get("status") != status_str
        self._conditions[type_] = {
            "type": type_, "status": status_str, "reason": reason, "message": message,
            "observedGeneration": self.obj["metadata"].get("generation"),
            "lastTransitionTime": rfc3339() if changed else previous["lastTransitionTime"],
        }

    def patch_status(self, status: Mapping | None = None, observed_generation: bool = True) -> dict:
        """Merge-patch the status subresource with the fields given, conditions set with
        ``set_condition`` and ``observedGeneration``. Skipped when nothing would change.
        A stale object (someone wrote since it was read) gets 409 and the key is retried."""
        patch: dict[str, Any] = dict(status or {})
        if observed_generation and "generation" in self.obj["metadata"]:
            patch["observedGeneration"] = self.obj["metadata"]["generation"]
        if self._conditions:
            merged = {c["type"]: c for c in (self.obj.get("status") or {}).get("conditions") or []}
            merged.update(self._conditions)
            patch["conditions"] = list(merged.values())
        current = self.obj.get("status") or {}
        if is_subset(patch, current):
            return self.obj
        body = {"metadata": {"resourceVersion": self.obj["metadata"]["resourceVersion"]},
                "status": patch}
        updated = self._write("PATCH",
                               self.primary.path(self.key.namespace, self.key.name) + "/status",
                               body, content_type=kube.MERGE_PATCH)
        self.obj = updated
        self._conditions.clear()
        return updated

    # --- events ----------------------------------------------------------------------------

    def event(self, type_: str, reason: str, message: str) -> None:
        """A Kubernetes Event on the object (``Normal`` or ``Warning``), aggregated so an error
        loop cannot flood the api-server, and kept in this run's history."""
        self.events.append({"type": type_, "reason": reason, "message": message})
        self._fence()
        events.record(self.api, self.obj, type_, reason, message)

    # --- finalizers --------------------------------------------------------------------------

    def _patch_finalizers(self, finalizers: list[str]) -> dict:
        body = {"metadata": {"finalizers": finalizers,
                             "resourceVersion": self.obj["metadata"]["resourceVersion"]}}
        self.obj = self._write("PATCH",
                                self.primary.path(self.key.namespace, self.key.name), body,
                                content_type=kube.MERGE_PATCH)
        return self.obj

    def add_finalizer(self, name: str) -> None:
        current = list(self.obj["metadata"].get("finalizers") or [])
        if name not in current:
            self._patch_finalizers(current + [name])

    def remove_finalizer(self, name: str) -> None:
        current = list(self.obj["metadata"].get("finalizers") or [])
        if name in current:
            self._patch_finalizers([f for f in current if f != name])

"""Children: the objects a run writes besides its own - created, applied, adopted, deleted or
patched through ``ctx`` - and client-go's expectations of them.

A child has one controller: ``create_or_update`` and ``apply`` set the run's object as its
controller owner and refuse a same-named object another controller (or nobody) controls
(``NotOwnedError``); ``adopt`` takes only an object nobody controls.

Every write here goes through ``Context._write``, so it passes the fence's check first, and a
write of an object the run read is conditional on that copy: ``create_or_update``'s patch and
``adopt`` carry its resourceVersion, ``apply`` its uid and resourceVersion in the applied body
(``_as_of``), ``delete`` the same as preconditions (``_delete_options``). The api-server refuses
(409) a write whose object changed since it was read, so a run stopped between its check and
its write cannot overwrite what a run that took its key over wrote. ``apply`` and ``delete`` go
once more on a fresh read when refused so, through the check again (``_as_read``): a run that
holds its key writes as before, one that does not is refused. ``patch`` is conditional only when
its body carries a ``metadata.resourceVersion``.
"""

from __future__ import annotations

import base64
import copy
from typing import Any, Callable, Iterable, Mapping

from reconcilers._kube import cache, kube
from reconcilers._base.reconcile import Key, TemporaryError
from reconcilers._base.vocab import GVR
from reconcilers._kube.lister import Lister, is_secret


class NotOwnedError(TemporaryError):
    """A child with the wanted name exists but another controller (or nobody) owns it."""


def is_subset(desired: Any, actual: Any) -> bool:
    """True when every field of ``desired`` already has that value in ``actual``."""
    if isinstance(desired, Mapping):
        return isinstance(actual, Mapping) and all(
            k in actual and is_subset(v, actual[k]) for k, v in desired.items())
    return desired == actual


def controller_of(obj: Mapping) -> Mapping | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


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


class Children:
    """``ctx``'s writes of children, for ``Context`` to inherit: what they need of the run -
    its key, its object and resource, its api, its reads and its fenced ``_write`` - is
    ``Context``'s."""

    key: Key
    obj: dict
    primary: GVR
    api: kube.ApiClient
    lister: Lister
    changed_children: list[str]
    _write: Callable[..., dict]
    get: Callable[..., "dict | None"]

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
        if is_secret(gvr):
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

"""The fake cluster's objects and the api-server's rules for writing them (``fake``'s store,
as the api-server's generic registry store is its): create, update, the three patches,
deletion with finalizers, and the garbage collector's background deletion that follows.

No I/O: ``fake.FakeApiServer`` parses each request and hands it here; what is refused raises
``Refused`` (the api-server's status code, reason and message) or ``NotModelled``.
"""

from __future__ import annotations

import copy
import secrets
import uuid as uuid_module
from typing import Any

from reconcilers._kube import fakefields, kube
from reconcilers._kube.fakefields import NotModelled, Refused
from reconcilers._kube.fakekinds import (BUILTINS, CRDS, NAMESPACES, RETURNS_OBJECT, Kind,
                                         kind_of_crd)
from reconcilers._kube.selectors import matches_fields, matches_labels
from reconcilers._base.vocab import rfc3339

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# The manager the api-server names for a write without ``fieldManager``: the User-Agent's
# product, ``django-crd-operator`` for the operator's own calls.
DEFAULT_MANAGER = kube.USER_AGENT.split("/")[0]


class Store:
    """Objects by ``(kind, namespace, name)``, who owns which of their fields, and the
    cluster's resourceVersion counter."""

    def __init__(self) -> None:
        self._kinds: dict[tuple[str, str, str], Kind] = {}
        for kind in BUILTINS:
            self._define(kind)
        self._objects: dict[tuple[Kind, str, str], dict] = {}
        # Per object: ``{(manager, operation, subresource): field paths}``.
        self._managed: dict[tuple[Kind, str, str], dict[tuple[str, str, str], set]] = {}
        self._version = 0  # the cluster's last resourceVersion: every write takes the next

    def _define(self, kind: Kind) -> None:
        self._kinds[(kind.gvr.group, kind.gvr.version, kind.gvr.plural)] = kind

    # --- reads ---------------------------------------------------------------------------

    def _get(self, kind: Kind, namespace: str, name: str) -> dict:
        return self._shown(kind, self._existing(kind, namespace, name))

    def _existing(self, kind: Kind, namespace: str, name: str) -> dict:
        obj = self._objects.get((kind, namespace, name))
        if obj is None:
            raise Refused(404, "NotFound", f'{kind.qualified} "{name}" not found')
        return obj

    def _list(self, kind: Kind, namespace: str, query: dict) -> dict:
        labels, fields = query.get("labelSelector") or "", query.get("fieldSelector") or ""
        # Refused when malformed even if nothing would be listed, as the api-server does.
        matches_labels(labels, {})
        matches_fields(fields, {"metadata.name": "", "metadata.namespace": ""})
        items = []
        for (k, ns, name), obj in sorted(self._objects.items(), key=lambda e: e[0][1:]):
            if k != kind or (namespace and ns != namespace):
                continue
            if matches_labels(labels, obj["metadata"].get("labels") or {}) and \
                    matches_fields(fields, {"metadata.name": name, "metadata.namespace": ns}):
                shown = self._shown(kind, obj)
                if not kind.custom:  # built-in lists leave each item's type out
                    shown.pop("apiVersion", None)
                    shown.pop("kind", None)
                items.append(shown)
        if str(query.get("limit") or "0").isdigit() and 0 < int(query.get("limit") or 0) \
                < len(items):
            raise NotModelled(f"the fake cluster does not model paginated lists (limit="
                              f"{query['limit']} of {len(items)} {kind.qualified})")
        return {"apiVersion": kind.gvr.api_version, "kind": f"{kind.gvr.kind}List",
                "metadata": {"resourceVersion": str(self._last)}, "items": items}

    def _shown(self, kind: Kind, obj: dict) -> dict:
        key = (kind, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        out = copy.deepcopy(obj)
        managed = [{"manager": m, "operation": op, "apiVersion": kind.gvr.api_version,
                    "time": obj["metadata"]["creationTimestamp"], "fieldsType": "FieldsV1",
                    "fieldsV1": fakefields.fields_v1(paths),
                    **({"subresource": sub} if sub else {})}
                   for (m, op, sub), paths in self._managed.get(key, {}).items() if paths]
        if managed:
            out["metadata"]["managedFields"] = managed
        return out

    @property
    def _last(self) -> int:
        return self._version

    # --- writes ----------------------------------------------------------------------------

    def _create(self, kind: Kind, namespace: str, body: Any, query: dict) -> dict:
        obj = self._checked_body(kind, body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if not meta.get("name"):
            raise Refused(422, "Invalid", f"{kind.gvr.kind}.{kind.gvr.group or 'core'} is "
                          "invalid: metadata.name: Required value: name or generateName is "
                          "required")
        if namespace and meta.get("namespace", namespace) != namespace:
            raise Refused(400, "BadRequest", "the namespace of the provided object does not "
                          "match the namespace sent on the request")
        if kind.gvr.namespaced:
            meta["namespace"] = namespace
            if (NAMESPACES, "", namespace) not in self._objects:
                raise Refused(404, "NotFound", f'namespaces "{namespace}" not found')
        if (kind, namespace, meta["name"]) in self._objects:
            raise Refused(409, "AlreadyExists",
                          f'{kind.qualified} "{meta["name"]}" already exists')
        for field in ("resourceVersion", "deletionTimestamp", "managedFields", "generation"):
            meta.pop(field, None)
        # A create sets no status through a kind with a status subresource: a custom
        # resource has none, a built-in one starts empty.
        if kind.status and kind.custom:
            obj.pop("status", None)
        elif kind.status:
            obj["status"] = {}
        meta.update(uid=str(uuid_module.uuid4()), creationTimestamp=rfc3339())
        if kind.generation:
            meta["generation"] = 1
        if kind == NAMESPACES:
            obj["spec"], obj["status"] = {"finalizers": ["kubernetes"]}, {"phase": "Active"}
        elif kind == CRDS:
            for served in kind_of_crd(obj):
                self._define(served)
        key = (kind, namespace, meta["name"])
        manager = query.get("fieldManager") or DEFAULT_MANAGER
        self._managed[key] = {(manager, "Update", ""): fakefields.owned(obj)}
        return self._store(key, obj)

    def _update(self, kind: Kind, namespace: str, name: str, body: Any, query: dict,
                sub: str) -> dict:
        current = self._existing(kind, namespace, name)
        wanted = self._checked_body(kind, body, name)
        rv = wanted.get("metadata", {}).get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise _modified(kind, name)
        return self._write(kind, current, wanted, query.get("fieldManager") or DEFAULT_MANAGER,
                           sub)

    def _patch(self, kind: Kind, namespace: str, name: str, body: Any, query: dict, sub: str,
               content_type: str) -> dict:
        if content_type == kube.APPLY_PATCH:
            return self._apply(kind, namespace, name, body, query, sub)
        current = self._existing(kind, namespace, name)
        if content_type == kube.MERGE_PATCH:
            if not isinstance(body, dict):
                raise Refused(400, "BadRequest", "a merge patch is a JSON object")
            wanted = fakefields.merge_patch(current, body)
        elif content_type == JSON_PATCH:
            wanted = fakefields.json_patch(current, body)
        elif content_type == STRATEGIC_MERGE and kind.custom:
            raise Refused(415, "UnsupportedMediaType", "the body of the request was in an "
                          "unknown format - accepted media types include: application/json-"
                          "patch+json, application/merge-patch+json, application/apply-patch"
                          "+yaml")
        elif content_type == STRATEGIC_MERGE:
            raise NotModelled("the fake cluster does not model strategic merge patches; send "
                              "a merge patch (application/merge-patch+json) or an apply")
        else:
            raise Refused(415, "UnsupportedMediaType",
                          f"the body of the request was in an unknown format: {content_type}")
        # A patch that names a resourceVersion is conditional on it.
        rv = (wanted.get("metadata") or {}).get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise _modified(kind, name)
        return self._write(kind, current, wanted, query.get("fieldManager") or DEFAULT_MANAGER,
                           sub)

    def _apply(self, kind: Kind, namespace: str, name: str, body: Any, query: dict,
               sub: str) -> dict:
        manager = query.get("fieldManager")
        if not manager:
            raise Refused(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: '
                          "fieldManager: Required value: is required for apply patch")
        applied = self._checked_body(kind, body, name)
        if not applied.get("apiVersion") or not applied.get("kind"):
            raise Refused(400, "BadRequest", "apiVersion and kind must be set in an apply")
        if sub:
            raise NotModelled("the fake cluster does not model server-side apply to a "
                              "subresource")
        key = (kind, namespace, name)
        current = self._objects.get(key)
        meta = applied.get("metadata") or {}
        if current is None:
            if meta.get("uid") or meta.get("resourceVersion"):
                raise Refused(404, "NotFound", f'{kind.qualified} "{name}" not found')
            made = self._create(kind, namespace, copy.deepcopy(applied),
                                {"fieldManager": manager})
            self._managed[key] = {(manager, "Apply", ""): fakefields.owned(applied)}
            return made
        if meta.get("uid") and meta["uid"] != current["metadata"]["uid"]:
            raise Refused(409, "Conflict", f"Precondition failed: UID in precondition: "
                          f"{meta['uid']}, UID in object meta: {current['metadata']['uid']}")
        if meta.get("resourceVersion") and \
                meta["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise _modified(kind, name)
        if kind.status:
            applied.pop("status", None)
        wanted, ownership = fakefields.apply(
            current, applied, self._managed.get(key, {}), manager,
            force=query.get("force") in ("true", "True", "1"))
        return self._write(kind, current, wanted, manager, sub, ownership)

    def _write(self, kind: Kind, current: dict, wanted: dict, manager: str, sub: str,
               ownership: dict | None = None) -> dict:
        """``current`` becomes ``wanted`` under the api-server's rules: the status
        subresource, generation, finalizers of an object being deleted, identity fields."""
        meta = current["metadata"]
        key = (kind, meta.get("namespace", ""), meta["name"])
        wanted = copy.deepcopy(wanted)
        if sub == "status":  # only status changes through /status
            wanted = {**copy.deepcopy(current), "status": wanted.get("status")}
            if wanted["status"] is None:
                wanted.pop("status")
        elif kind.status:  # and never through the object
            wanted.pop("status", None)
            if "status" in current:
                wanted["status"] = copy.deepcopy(current["status"])
        new_meta = wanted.setdefault("metadata", {})
        for field in ("uid", "creationTimestamp", "deletionTimestamp", "generation",
                      "namespace", "name", "deletionGracePeriodSeconds"):
            if field in meta:
                new_meta[field] = meta[field]
            else:
                new_meta.pop(field, None)
        new_meta.pop("managedFields", None)
        new_meta["resourceVersion"] = meta["resourceVersion"]
        wanted["apiVersion"], wanted["kind"] = kind.gvr.api_version, kind.gvr.kind
        if meta.get("deletionTimestamp"):
            added = set(new_meta.get("finalizers") or []) - set(meta.get("finalizers") or [])
            if added:
                raise Refused(422, "Invalid", f'{kind.gvr.kind} "{meta["name"]}" is invalid: '
                              "metadata.finalizers: Forbidden: no new finalizers can be added "
                              "if the object is being deleted")
        before = self._managed.get(key, {})
        if wanted == current and ownership is None:
            return self._shown(kind, current)
        if ownership is None:
            ownership = {k: set(v) for k, v in self._managed.get(key, {}).items()}
            taken = fakefields.changed(current, wanted) - fakefields.IDENTITY
            gone = fakefields.removed(current, wanted)
            for paths in ownership.values():
                paths -= taken | gone
            mine = (manager, "Update", "status" if sub == "status" else "")
            ownership[mine] = ownership.get(mine, set()) | {
                p for p in taken if p[:1] != ("metadata",) or p[:2] in (
                    ("metadata", "labels"), ("metadata", "annotations"),
                    ("metadata", "finalizers"), ("metadata", "ownerReferences"))}
        # managedFields are part of the object: a write that changes only who owns what (a
        # second manager applying the same values) is a change, with a new resourceVersion.
        ownership = {k: v for k, v in ownership.items() if v}
        self._managed[key] = ownership
        if wanted == current and ownership == {k: v for k, v in before.items() if v}:
            return self._shown(kind, current)
        if kind.generation and _spec_of(wanted) != _spec_of(current):
            new_meta["generation"] = meta.get("generation", 1) + 1
        if meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
            return self._remove(key)
        return self._store(key, wanted)

    def _store(self, key: tuple[Kind, str, str], obj: dict) -> dict:
        obj["apiVersion"], obj["kind"] = key[0].gvr.api_version, key[0].gvr.kind
        obj["metadata"]["resourceVersion"] = str(self._next_version())
        self._objects[key] = obj
        return self._shown(key[0], obj)

    def _next_version(self) -> int:
        self._version += 1
        return self._version

    # --- deletion --------------------------------------------------------------------------

    def _delete(self, kind: Kind, namespace: str, name: str, options: dict,
                query: dict) -> dict:
        current = self._existing(kind, namespace, name)
        policy = options.get("propagationPolicy") or query.get("propagationPolicy")
        if policy not in (None, "Background"):
            raise NotModelled(f"the fake cluster models background deletion only, not "
                              f"propagationPolicy={policy}")
        if options.get("dryRun"):
            raise NotModelled("the fake cluster does not model dryRun")
        meta = current["metadata"]
        preconditions = options.get("preconditions") or {}
        if preconditions.get("uid") and preconditions["uid"] != meta["uid"]:
            raise Refused(409, "Conflict", f"Precondition failed: UID in precondition: "
                          f"{preconditions['uid']}, UID in object meta: {meta['uid']}")
        rv = preconditions.get("resourceVersion")
        if rv and rv != meta["resourceVersion"]:
            raise Refused(409, "Conflict", f"Precondition failed: ResourceVersion in "
                          f"precondition: {rv}, ResourceVersion in object meta: "
                          f"{meta['resourceVersion']}")
        key = (kind, namespace, name)
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                marked = copy.deepcopy(current)
                marked["metadata"].update(deletionTimestamp=rfc3339(),
                                          deletionGracePeriodSeconds=0)
                if kind.generation:
                    marked["metadata"]["generation"] = meta.get("generation", 1) + 1
                self._store(key, marked)
            return self._shown(kind, self._objects[key])
        return self._remove(key)

    def _remove(self, key: tuple[Kind, str, str]) -> dict:
        """The object gone, and what the garbage collector and the namespace controller do
        after it: dependents of an owner deleted in the background, a namespace's contents."""
        kind = key[0]
        obj = self._objects.pop(key)
        self._managed.pop(key, None)
        obj["metadata"]["resourceVersion"] = str(self._next_version())
        if kind == NAMESPACES:
            for inner in [k for k in self._objects if k[1] == key[2] and k[0].gvr.namespaced]:
                if inner in self._objects:
                    self._delete(inner[0], inner[1], inner[2], {}, {})
        self._collect_garbage()
        if kind.custom or kind.gvr.plural in RETURNS_OBJECT:
            return self._shown(kind, obj)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": key[2], "group": kind.gvr.group, "kind": kind.gvr.plural,
                            "uid": obj["metadata"]["uid"]}}

    def _collect_garbage(self) -> None:
        """Background deletion: an object whose owners are all gone is deleted; one that keeps
        an owner loses the references to those gone."""
        alive = {o["metadata"]["uid"] for o in self._objects.values()}
        for key, obj in list(self._objects.items()):
            if key not in self._objects:
                continue  # deleted by an earlier pass of this loop
            refs = obj["metadata"].get("ownerReferences") or []
            dangling = [r for r in refs if r.get("uid") not in alive]
            if not dangling:
                continue
            if len(dangling) == len(refs):
                if not obj["metadata"].get("deletionTimestamp"):
                    self._delete(key[0], key[1], key[2], {}, {})
            else:
                kept = copy.deepcopy(obj)
                kept["metadata"]["ownerReferences"] = [r for r in refs if r not in dangling]
                self._write(key[0], obj, kept, "garbage-collector", "")

    # --- helpers ---------------------------------------------------------------------------

    def _checked_body(self, kind: Kind, body: Any, name: str | None = None) -> dict:
        if not isinstance(body, dict):
            raise Refused(400, "BadRequest", "the request body is not an object")
        obj = copy.deepcopy(body)
        if obj.get("kind") not in (None, kind.gvr.kind) or \
                obj.get("apiVersion") not in (None, kind.gvr.api_version):
            raise Refused(400, "BadRequest", f"the body is a {obj.get('apiVersion')} "
                          f"{obj.get('kind')}, not a {kind.gvr.api_version} {kind.gvr.kind}")
        given = (obj.get("metadata") or {}).get("name")
        if name is not None and given not in (None, name):
            raise Refused(400, "BadRequest", "the name of the object "
                          f"({given}) does not match the name on the URL ({name})")
        return obj


def _spec_of(obj: dict) -> dict:
    """What generation counts: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _modified(kind: Kind, name: str) -> Refused:
    return Refused(409, "Conflict", f'Operation cannot be fulfilled on {kind.qualified} '
                   f'"{name}": the object has been modified; please apply your changes to the '
                   "latest version and try again")

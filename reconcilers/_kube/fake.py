"""An api-server in memory, for unit tests: what ``reconcilers.testing.FakeCluster`` runs.

A ``kube.Offline``: ``kube.request`` hands it the very requests it would send - method, path,
query, body, content type - so ``ctx``, the runner and a reconciler's code run unchanged
against it, without a thread, a socket, Redis or PostgreSQL. It answers as the api-server
does, for what it models:

- create, get, list (label selectors, equality and set-based; field selectors on
  ``metadata.name`` / ``metadata.namespace``), update (PUT), delete;
- a cluster-wide resourceVersion counter, bumped by every write that changes an object and
  only then (an unchanged write is answered with the object as it was); uid and
  creationTimestamp on create; ``generation`` raised by a change outside metadata and status
  for kinds that keep one; a ``generateName``;
- a write that names a resourceVersion other than the object's is refused 409 Conflict, as are
  a delete's failed preconditions and a create of a name that exists (AlreadyExists);
- patches: JSON merge patch, JSON patch, server-side apply with ``managedFields`` ownership
  (conflicts between field managers, ``force``, fields a manager stops applying removed);
  a strategic merge patch to a custom resource is refused 415, as the api-server refuses it;
- the status subresource, for kinds that declare one: writes to the object leave status
  alone, writes to ``/status`` change nothing else;
- deletion with finalizers (``deletionTimestamp`` set, the object removed when its last
  finalizer goes; no finalizer may be added meanwhile), and the garbage collector's
  background deletion: dependents whose owners are all gone are deleted (at once, where the
  real collector takes a moment), dangling owner references of the others removed;
- Events, through core/v1 and events.k8s.io/v1, each kept as written.

Everything else - watches, discovery, dry runs, strategic merge patches to built-in kinds,
foreground and orphan deletion, CRD schema validation, pruning and defaulting, admission -
raises ``NotModelled``, naming what is missing: a test never passes on behaviour the fake
only pretends to have.
"""

from __future__ import annotations

import copy
import json
import secrets
import uuid as uuid_module
from dataclasses import dataclass
from typing import Any, Iterable

import yaml

from reconcilers._kube import fakefields, kube
from reconcilers._kube.fakefields import Refused
from reconcilers._kube.selectors import matches_fields, matches_labels
from reconcilers._base.vocab import GVR, rfc3339

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# The manager the api-server names for a write without ``fieldManager``: the User-Agent's
# product, ``django-crd-operator`` for the operator's own calls.
DEFAULT_MANAGER = kube.USER_AGENT.split("/")[0]


class NotModelled(NotImplementedError):
    """A request the fake cluster does not answer as the api-server would: the message names
    what is not modelled. A test that meets it needs the real control plane."""


@dataclass(frozen=True)
class Kind:
    """A resource the fake serves, and the api-server's rules for it."""

    gvr: GVR
    status: bool = False  # has a status subresource
    generation: bool = False  # keeps metadata.generation
    custom: bool = False  # served from a CustomResourceDefinition

    @property
    def qualified(self) -> str:
        """How the api-server's messages name it: ``foos.samplecontroller.k8s.io``."""
        return f"{self.gvr.plural}.{self.gvr.group}" if self.gvr.group else self.gvr.plural


def _builtin(api_version: str, kind: str, plural: str | None = None, namespaced: bool = True,
             status: bool = False, generation: bool = False) -> Kind:
    return Kind(GVR.of(api_version, kind, plural, namespaced), status, generation)


BUILTINS = [
    _builtin("v1", "Namespace", namespaced=False, status=True),
    _builtin("v1", "ConfigMap"), _builtin("v1", "Secret"), _builtin("v1", "ServiceAccount"),
    _builtin("v1", "Service", status=True), _builtin("v1", "Pod", status=True),
    _builtin("v1", "PersistentVolumeClaim", status=True), _builtin("v1", "Event"),
    _builtin("v1", "Endpoints", "endpoints"),
    _builtin("apps/v1", "Deployment", status=True, generation=True),
    _builtin("apps/v1", "StatefulSet", status=True, generation=True),
    _builtin("apps/v1", "ReplicaSet", status=True, generation=True),
    _builtin("apps/v1", "DaemonSet", status=True, generation=True),
    _builtin("batch/v1", "Job", status=True, generation=True),
    _builtin("batch/v1", "CronJob", status=True, generation=True),
    _builtin("networking.k8s.io/v1", "Ingress", status=True, generation=True),
    _builtin("policy/v1", "PodDisruptionBudget", status=True, generation=True),
    _builtin("events.k8s.io/v1", "Event"),
    _builtin("coordination.k8s.io/v1", "Lease"),
    _builtin("rbac.authorization.k8s.io/v1", "Role"),
    _builtin("rbac.authorization.k8s.io/v1", "RoleBinding"),
    _builtin("rbac.authorization.k8s.io/v1", "ClusterRole", namespaced=False),
    _builtin("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", namespaced=False),
    _builtin("apiextensions.k8s.io/v1", "CustomResourceDefinition", namespaced=False,
             status=True, generation=True),
]
NAMESPACES = BUILTINS[0]
CRDS = BUILTINS[-1]
# A delete answers with the object for these (and custom resources); a Status for the rest.
RETURNS_OBJECT = {"pods", "customresourcedefinitions"}


def kind_of_crd(crd: dict) -> list[Kind]:
    """The resources a CustomResourceDefinition serves, one per served version."""
    spec = crd["spec"]
    return [Kind(GVR(spec["group"], v["name"], spec["names"]["plural"], spec["names"]["kind"],
                     spec.get("scope", "Namespaced") == "Namespaced"),
                 status="status" in (v.get("subresources") or {}), generation=True,
                 custom=True)
            for v in spec.get("versions") or [] if v.get("served", True)]


class FakeApiServer(kube.Offline):
    """The in-memory api-server. ``request`` (``kube.request``'s arguments) is its one door;
    what it keeps is read with ``object`` and ``objects``."""

    def __init__(self, crds: Iterable[dict] = ()) -> None:
        super().__init__(self.request)
        self._kinds: dict[tuple[str, str, str], Kind] = {}
        for kind in BUILTINS:
            self._define(kind)
        self._objects: dict[tuple[Kind, str, str], dict] = {}
        # Per object: ``{(manager, operation, subresource): field paths}``.
        self._managed: dict[tuple[Kind, str, str], dict[tuple[str, str, str], set]] = {}
        self._version = 0  # the cluster's last resourceVersion: every write takes the next
        for crd in crds:
            self.request("POST", CRDS.gvr.path(), crd)
        self.request("POST", NAMESPACES.gvr.path(), {"metadata": {"name": "default"}})

    # --- the door ------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, query: dict | None = None,
                content_type: str = kube.JSON) -> Any:
        """One call, answered as the api-server answers it: the JSON body of a 2xx answer,
        or ``kube.ApiError`` with the status code, reason and ``Status`` body it would send."""
        path, _, raw_query = path.partition("?")
        query = {**dict(part.split("=", 1) for part in raw_query.split("&") if "=" in part),
                 **(query or {})}
        body = copy.deepcopy(body)
        try:
            if isinstance(body, (bytes, str)) and body:
                body = yaml.safe_load(body) if content_type == kube.APPLY_PATCH \
                    else json.loads(body)
            return copy.deepcopy(self._route(method, path, query, body, content_type))
        except Refused as refused:
            raise _api_error(refused) from None

    def _route(self, method: str, path: str, query: dict, body: Any, content_type: str) -> Any:
        if path == "/version":
            return {"major": "1", "minor": "34", "gitVersion": "v1.34.0-fake"}
        for option in ("watch", "dryRun", "resourceVersionMatch", "continue"):
            if query.get(option) not in (None, "", "false", "0"):
                raise NotModelled(f"the fake cluster does not model {option}= ({method} "
                                  f"{path})")
        kind, namespace, name, sub = self._parse(path)
        if sub not in ("", "status"):
            raise NotModelled(f"the fake cluster does not model the {sub!r} subresource "
                              f"({method} {path})")
        if sub == "status" and not kind.status:
            raise Refused(404, "NotFound", "the server could not find the requested resource")
        if name is None:
            if method == "GET":
                return self._list(kind, namespace, query)
            if method == "POST":
                return self._create(kind, namespace, body, query)
            raise NotModelled(f"the fake cluster does not model {method} of a collection "
                              f"({path})")
        if method == "GET":
            return self._get(kind, namespace, name)
        if method == "PUT":
            return self._update(kind, namespace, name, body, query, sub)
        if method == "PATCH":
            return self._patch(kind, namespace, name, body, query, sub, content_type)
        if method == "DELETE":
            return self._delete(kind, namespace, name, body or {}, query)
        raise NotModelled(f"the fake cluster does not model {method} ({path})")

    def _parse(self, path: str) -> tuple[Kind, str, str | None, str]:
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["api"] and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise NotModelled(f"the fake cluster does not serve {path} (discovery and other "
                              "non-resource paths are not modelled)")
        namespace = ""
        if rest[0] == "namespaces" and len(rest) >= 3 and not (
                group == "" and len(rest) == 3 and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
        kind = self._kinds.get((group, version, rest[0]))
        if kind is None:
            raise Refused(404, "NotFound", "the server could not find the requested resource")
        if namespace and not kind.gvr.namespaced:
            raise Refused(404, "NotFound", "the server could not find the requested resource")
        return kind, namespace, rest[1] if len(rest) > 1 else None, "/".join(rest[2:])

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
        if kind.status and kind.custom:
            obj.pop("status", None)
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
        mine = (manager, "Apply", "")
        ownership = {k: set(v) for k, v in self._managed.get(key, {}).items()}
        new = fakefields.owned(applied)
        conflicts: dict[str, list] = {}
        for other, paths in ownership.items():
            if other[0] == manager:
                continue
            for path in sorted(new & paths, key=repr):
                if fakefields.value_at(applied, path) != fakefields.value_at(current, path):
                    conflicts.setdefault(other[0], []).append(path)
        if conflicts and query.get("force") not in ("true", "True", "1"):
            message, causes = fakefields.conflicts_message(conflicts)
            raise Refused(409, "Conflict", message, causes)
        for other, paths in ownership.items():
            if other[0] in conflicts:
                paths -= set(conflicts[other[0]])
        wanted = copy.deepcopy(current)
        shared = set().union(*(p for o, p in ownership.items() if o != mine)) \
            if ownership else set()
        for path in ownership.get(mine, set()) - new - shared:
            fakefields.remove_at(wanted, path)
        wanted = fakefields.apply_merge(wanted, {k: v for k, v in applied.items()
                                                 if k != "metadata"})
        wanted["metadata"] = fakefields.apply_merge(
            wanted["metadata"], {k: v for k, v in meta.items()
                                 if k not in ("uid", "resourceVersion", "managedFields")},
            ("metadata",))
        ownership[mine] = new
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

    def object(self, gvr: GVR, namespace: str | None, name: str) -> dict | None:
        """An object as a GET would answer it; None when there is none."""
        kind = self._kinds.get((gvr.group, gvr.version, gvr.plural))
        obj = self._objects.get((kind, namespace or "", name)) if kind else None
        return self._shown(kind, obj) if obj is not None else None

    def objects(self, gvr: GVR, namespace: str | None = None) -> list[dict]:
        """Every object of a resource (in ``namespace``), sorted by namespace and name."""
        kind = self._kinds.get((gvr.group, gvr.version, gvr.plural))
        if kind is None:
            return []
        return [self._shown(kind, o) for k, o in sorted(self._objects.items(),
                                                        key=lambda e: e[0][1:])
                if k[0] == kind and (not namespace or k[1] == namespace)]

    def kind_for(self, api_version: str, kind: str) -> GVR:
        """The resource served for that apiVersion and kind."""
        group, _, version = api_version.rpartition("/")
        for (g, v, _), served in self._kinds.items():
            if (g, v, served.gvr.kind) == (group, version, kind):
                return served.gvr
        raise NotModelled(f"the fake cluster serves no {api_version} {kind}: give it the "
                          "CustomResourceDefinition, or use the real control plane")


def _spec_of(obj: dict) -> dict:
    """What generation counts: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _modified(kind: Kind, name: str) -> Refused:
    return Refused(409, "Conflict", f'Operation cannot be fulfilled on {kind.qualified} '
                   f'"{name}": the object has been modified; please apply your changes to the '
                   "latest version and try again")


def _api_error(refused: Refused) -> kube.ApiError:
    """The error ``kube.request`` raises for the api-server's answer: status, reason, and the
    ``Status`` body it would carry."""
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": refused.message, "reason": refused.reason, "code": refused.code}
    if refused.causes:
        status["details"] = {"causes": refused.causes}
    error = kube.ApiError(refused.code, refused.reason, refused.message)
    error.body = json.dumps(status)
    return error



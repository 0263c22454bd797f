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

This module parses a request and routes it; ``fakestore`` keeps the objects and applies the
write rules, ``fakefields`` the patches and field ownership, ``fakekinds`` says which
resources are served, and ``selectors`` matches label and field selectors.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Iterable

import yaml

from reconcilers._kube import kube
from reconcilers._kube.fakefields import NotModelled, Refused
from reconcilers._kube.fakekinds import CRDS, NAMESPACES, Kind
from reconcilers._kube.fakestore import Store
from reconcilers._base.vocab import GVR


class FakeApiServer(Store, kube.Offline):
    """The in-memory api-server. ``request`` (``kube.request``'s arguments) is its one door;
    what it keeps is read with ``object`` and ``objects``."""

    def __init__(self, crds: Iterable[dict] = ()) -> None:
        Store.__init__(self)
        kube.Offline.__init__(self, self.request)
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



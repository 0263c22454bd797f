"""Shared words at the bottom: object paths, resources, plurals, the clock.

Every other module imports these; this module imports nothing of the app (and nothing of
Django or Kubernetes), so it can never be part of an import cycle. Like client-go's
``cache.MetaNamespaceKeyFunc`` and ``schema.GroupVersionResource``, each idea is defined once:

- ``object_path(namespace, name)`` - ``<namespace>/<name>`` (``<name>`` when cluster-scoped),
  the object part of a key (``reconcile.Key``) and the field of the shared cache.
- ``GVR`` / ``Owns`` / ``plural()`` - a resource, a child resource, and the one plural rule.
- ``Watches`` / ``Index`` - a related resource mapped to keys, and a named index over a watched
  resource (declarations only: the watcher and ``ctx.list`` act on them).
- ``utcnow()`` / ``rfc3339()`` - the one clock, and the timestamp format Kubernetes writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Sequence


def object_path(namespace: str | None, name: str) -> str:
    """``<namespace>/<name>``, or ``<name>`` for a cluster-scoped object (client-go's
    ``MetaNamespaceKeyFunc``)."""
    return f"{namespace}/{name}" if namespace else name


def split_object_path(path: str) -> tuple[str, str]:
    namespace, _, name = path.rpartition("/")
    return namespace, name


def plural(kind: str) -> str:
    """The resource name Kubernetes conventionally gives ``kind``: ``NetworkPolicy`` ->
    ``networkpolicies``, ``Ingress`` -> ``ingresses``, ``Gateway`` -> ``gateways``.

    Irregular kinds (``Endpoints``) must name their plural explicitly.
    """
    word = kind.lower()
    if word.endswith("y") and word[-2:-1] not in ("a", "e", "i", "o", "u"):
        return word[:-1] + "ies"
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    return word + "s"


@dataclass(frozen=True)
class GVR:
    """A watched resource: API group, version, plural, and kind."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @classmethod
    def of(cls, api_version: str, kind: str, plural_name: str | None = None,
           namespaced: bool = True) -> "GVR":
        """From ``apiVersion`` (``apps/v1``, ``v1``) and kind, with the conventional plural."""
        group, _, version = api_version.rpartition("/")
        return cls(group, version, plural_name or plural(kind), kind, namespaced)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def id(self) -> str:
        """``apps/v1/deployments``; ``core/v1/configmaps`` for the core group."""
        return f"{self.group or 'core'}/{self.version}/{self.plural}"

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The api-server path of the collection (in ``namespace``), or of one object."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace and self.namespaced:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


@dataclass(frozen=True)
class CacheScope:
    """What the watcher caches of one resource (controller-runtime's per-object cache
    options): only objects matching a label ``selector`` and a field selector (``fields``),
    in kubectl's syntax, and with ``metadata_only`` nothing but their metadata. The default,
    everything in full, is what a primary resource always gets."""

    selector: str = ""
    fields: str = ""
    metadata_only: bool = False

    @property
    def whole(self) -> bool:
        """Every object is cached (a miss means "deleted"), though maybe metadata only."""
        return not (self.selector or self.fields)


# A predicate, as ``predicates.py`` defines it: ``(old, new) -> bool`` over API bodies.
Predicate = Callable[["dict | None", "dict | None"], bool]


class _Related:
    """What ``Owns`` and ``Watches`` share: the resource, what is cached of it, and the
    predicates its changes must pass before they become keys. Their fields stay declared on
    each, because their positional orders are public and differ (``Watches``' third is its
    map function)."""

    api_version: str
    kind: str
    plural: str | None
    namespaced: bool
    selector: str
    fields: str
    metadata_only: bool
    predicates: Sequence[Predicate]

    def gvr(self) -> GVR:
        return GVR.of(self.api_version, self.kind, self.plural, self.namespaced)

    def scope(self) -> CacheScope:
        return CacheScope(self.selector, self.fields, self.metadata_only)


@dataclass(frozen=True)
class Owns(_Related):
    """A child resource the reconciler creates; its events enqueue the controller owner's key.

    ``Owns("apps/v1", "Deployment")``. The plural follows ``plural()`` unless given.
    ``selector`` / ``fields`` / ``metadata_only`` narrow what the watcher caches of it
    (``CacheScope``): ``Owns("apps/v1", "Deployment", selector="app.kubernetes.io/managed-by=
    foo-operator")`` keeps the cluster's other Deployments out of the cache.
    ``predicates`` filter its changes before they reconcile the owner (controller-runtime's
    ``Owns(obj, WithPredicates(...))``): ``predicates=[generation_changed]`` for an owner that
    does not read the child's status. The cache still keeps every change.
    """

    api_version: str
    kind: str
    plural: str | None = None
    namespaced: bool = True
    selector: str = ""
    fields: str = ""
    metadata_only: bool = False
    predicates: Sequence[Predicate] = field(default=(), kw_only=True)


@dataclass(frozen=True)
class Watches(_Related):
    """A related resource the reconciler does not own, whose changes reconcile the objects
    ``map(obj)`` names (controller-runtime's ``Watches`` with a map function): a ConfigMap or
    Secret that objects reference by name, say.

    ``map(obj)`` returns the objects to reconcile as names (in ``obj``'s namespace) or
    ``(namespace, name)`` pairs; declared with two parameters, ``map(obj, lister)`` also gets a
    ``Lister`` to read from (say, the objects whose selector matches ``obj``). ``predicates``
    filter changes first, as for ``Owns``.
    ``selector`` / ``fields`` / ``metadata_only``: what is cached of it, as for ``Owns``.
    """

    api_version: str
    kind: str
    map: Callable[[dict], Iterable[Any]]
    predicates: Sequence[Predicate] = ()
    plural: str | None = None
    namespaced: bool = True
    selector: str = ""
    fields: str = ""
    metadata_only: bool = False


@dataclass(frozen=True)
class Index:
    """A named index over a watched resource (client-go's indexers, controller-runtime's field
    indexers): ``func(obj)`` returns the values the object is filed under, and
    ``ctx.list(api_version, kind, index=(name, value))`` returns the objects filed under one.

    ``Index("v1", "Pod", "node", lambda pod: [pod["spec"].get("nodeName") or ""])``. The
    watcher keeps it in the shared cache; ``func`` sees the object as cached (sanitised).
    """

    api_version: str
    kind: str
    name: str
    func: Callable[[dict], Iterable[str]]

    def values(self, obj: dict | None) -> set[str]:
        """The values ``obj`` is filed under; none for a missing object."""
        if obj is None:
            return set()
        return {str(v) for v in self.func(obj) if v is not None}


def utcnow() -> datetime:
    """Now, timezone-aware, in UTC: the one clock of the app outside the database."""
    return datetime.now(timezone.utc)


def rfc3339(t: datetime | None = None, micros: bool = False) -> str:
    """A Kubernetes timestamp: ``2026-01-02T03:04:05Z`` (``MicroTime`` with ``micros``)."""
    t = (t or utcnow()).astimezone(timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micros else "%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> datetime | None:
    """The inverse of ``rfc3339`` (either precision); ``None`` for an empty value."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))

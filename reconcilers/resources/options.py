"""What a resource declares besides its fields: versions, printer columns, subresources, names.

``Options`` is the resolved, validated form of a ``Resource``'s class attributes and ``Meta``
(``Foo._meta``, as in Django). Everything is checked when the class is defined, so a typo in a
printer column's path fails at import time, not when the api-server rejects the CRD.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from django.core.exceptions import ImproperlyConfigured

from reconcilers._base.vocab import plural as plural_of
from .field import Field, camel_case
from .fields import Integer, Object

if TYPE_CHECKING:
    from .registry import KindRegistry

# A ``Resource`` subclass. Named by alias, not imported: ``base`` imports this module.
ResourceClass = type

SCOPES = ("Namespaced", "Cluster")
# CRDs in these groups are refused unless this annotation says how the API was approved.
APPROVAL_ANNOTATION = "api-approved.kubernetes.io"
PROTECTED_GROUPS = ("k8s.io", "kubernetes.io")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class PrinterColumn:
    """A ``kubectl get`` column. ``path`` is a Python path through the declared fields
    (``"spec.deployment_name"``: the JSON path, type and description are derived from the
    field) or a raw JSON path starting with ``.`` (give ``type`` yourself)."""

    name: str
    path: str
    type: str | None = None
    description: str | None = None
    format: str | None = None
    priority: int = 0

    @classmethod
    def age(cls) -> PrinterColumn:
        return cls("Age", ".metadata.creationTimestamp", type="date")

    def manifest(self, version: Version) -> dict[str, Any]:
        json_path, found = resolve_path(version, self.path)
        out: dict[str, Any] = {
            "name": self.name,
            "type": self.type or (found.column_type if found else "string"),
            "jsonPath": json_path,
        }
        description = self.description or (found.help_text if found else "")
        if description:
            out["description"] = description
        if self.format:
            out["format"] = self.format
        if self.priority:
            out["priority"] = self.priority
        return out


@dataclass(frozen=True)
class Scale:
    """The scale subresource (``kubectl scale``, HorizontalPodAutoscaler), by Python paths."""

    spec_replicas: str = "spec.replicas"
    status_replicas: str = "status.replicas"
    label_selector: str | None = None

    def manifest(self, version: Version) -> dict[str, Any]:
        out = {}
        for key, path, root in (("specReplicasPath", self.spec_replicas, "spec"),
                                ("statusReplicasPath", self.status_replicas, "status")):
            json_path, found = resolve_path(version, path)
            if not json_path.startswith(f".{root}.") or not isinstance(found, Integer):
                raise ImproperlyConfigured(f"scale {key}: {path!r} must name an Integer field "
                                           f"under {root}")
            out[key] = json_path
        if self.label_selector:
            out["labelSelectorPath"] = resolve_path(version, self.label_selector)[0]
        return out


@dataclass(frozen=True)
class Version:
    """One served version of a kind. ``spec``, ``status`` and ``printer_columns`` default to
    the resource's own; give them to a version whose schema differs.

    Versions whose fields differ are converted hub-and-spoke (kubebuilder's scheme): the
    storage version is the hub, every other version gives ``to_hub(obj) -> obj`` and
    ``from_hub(obj) -> obj`` (plain dicts; ``apiVersion`` is set for you). Declaring them turns
    the CRD's conversion to ``strategy: Webhook``, served by ``manage.py webhook serve``."""

    name: str
    served: bool = True
    storage: bool = False
    deprecated: bool = False
    deprecation_warning: str | None = None
    spec: Object | None = None
    status: Object | None = None
    printer_columns: Sequence[PrinterColumn] | None = None
    to_hub: Callable[[dict], dict] | None = None
    from_hub: Callable[[dict], dict] | None = None


def resolve_path(version: Version, path: str) -> tuple[str, Field | None]:
    """``"spec.deployment_name"`` -> ``(".spec.deploymentName", <the String field>)``.

    Raw JSON paths (leading ``.``) pass through unresolved; ``metadata.*`` is camel-cased."""
    if path.startswith("."):
        return path, None
    head, *rest = path.split(".")
    if head == "metadata":
        return "." + ".".join(["metadata", *map(camel_case, rest)]), None
    current: Field | None = {"spec": version.spec, "status": version.status}.get(head)
    parts = [head]
    for name in rest:
        child = current.field_for(name) if isinstance(current, Object) else None
        if child is None:
            break
        parts.append(child.json_name)
        current = child
    else:
        if current is not None:
            return "." + ".".join(parts), current
    raise ImproperlyConfigured(f"{path!r} does not name a declared field of version "
                               f"{version.name}")


@dataclass(frozen=True)
class Options:
    resource: ResourceClass
    group: str
    kind: str
    plural: str
    singular: str
    list_kind: str
    scope: str
    versions: tuple[Version, ...]
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    scale: Scale | None = None
    status_subresource: bool = True
    description: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    registry: KindRegistry | None = field(default=None, compare=False, repr=False)
    # Where the api-server reaches the conversion webhook: namespace, Service, port.
    webhook_service: tuple[str, str, int] = ("django-crd-operator",
                                             "django-crd-operator-webhook", 443)

    @property
    def converts(self) -> bool:
        """Whether versions differ enough to need the conversion webhook."""
        return any(v.to_hub or v.from_hub for v in self.versions)

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def storage_version(self) -> Version:
        return next(v for v in self.versions if v.storage)

    def version(self, name: str) -> Version:
        for v in self.versions:
            if v.name == name:
                return v
        raise LookupError(f"{self.kind} has no version {name!r}")

    def version_for(self, api_version: str | None) -> Version:
        """The version of an object's ``apiVersion`` (the storage version when absent)."""
        if not api_version:
            return self.storage_version
        return self.version(api_version.rpartition("/")[2])


def build_options(resource: ResourceClass, meta: type | None,
                  default_registry: KindRegistry) -> Options:
    """Validate a resource's declaration into its ``Options``."""
    def opt(name: str, default: Any = None) -> Any:
        return getattr(meta, name, default) if meta is not None else default

    label = resource.__qualname__
    group = getattr(resource, "group", None)
    if not group or "." not in group:
        raise ImproperlyConfigured(f"{label}.group must be a DNS subdomain with a dot, "
                                   f"e.g. 'example.com' (got {group!r})")
    kind = getattr(resource, "kind", None) or resource.__name__
    singular = opt("singular") or kind.lower()
    plural = opt("plural") or plural_of(singular)
    for name in (plural, singular, *opt("short_names", ())):
        if not _DNS_LABEL.match(name):
            raise ImproperlyConfigured(f"{label}: {name!r} must be a lowercase DNS label")
    scope = opt("scope", "Namespaced")
    if scope not in SCOPES:
        raise ImproperlyConfigured(f"{label}.Meta.scope must be one of {SCOPES}, not {scope!r}")
    versions = _resolve_versions(resource, label, tuple(opt("printer_columns", ()) or ()))
    options = Options(
        resource=resource, group=group, kind=kind, plural=plural, singular=singular,
        list_kind=opt("list_kind") or f"{kind}List", scope=scope, versions=versions,
        short_names=tuple(opt("short_names", ())), categories=tuple(opt("categories", ())),
        scale=opt("scale"), status_subresource=opt("status_subresource", True),
        description=_docstring(resource), labels=dict(opt("labels", {})),
        annotations=dict(opt("annotations", {})), registry=opt("registry", default_registry),
        webhook_service=tuple(opt("webhook_service", ("django-crd-operator",
                                                      "django-crd-operator-webhook", 443))),
    )
    for v in versions:
        if options.converts and not v.storage and not (v.to_hub and v.from_hub):
            raise ImproperlyConfigured(f"{label}: version {v.name} needs both to_hub and "
                                       f"from_hub (the storage version is the hub)")
    protected = any(group == g or group.endswith("." + g) for g in PROTECTED_GROUPS)
    if protected and APPROVAL_ANNOTATION not in options.annotations:
        raise ImproperlyConfigured(
            f"{label}: group {group} is protected; set Meta.annotations = "
            f"{{{APPROVAL_ANNOTATION!r}: '<approval PR URL or \"unapproved, ...\">'}}")
    for v in versions:
        for column in v.printer_columns or ():
            column.manifest(v)
        if options.scale is not None:
            options.scale.manifest(v)
    return options


def _resolve_versions(resource: ResourceClass, label: str,
                      columns: tuple[PrinterColumn, ...]) -> tuple[Version, ...]:
    declared = getattr(resource, "versions", None)
    single = getattr(resource, "version", None)
    if bool(declared) == bool(single):
        raise ImproperlyConfigured(f"{label}: declare either version = '...' or versions = [...]")
    if single:
        declared = [Version(single, storage=True)]
    versions = [v if isinstance(v, Version) else Version(v) for v in declared]
    if len(versions) == 1 and not versions[0].storage:
        versions[0] = dataclasses.replace(versions[0], storage=True)
    names = [v.name for v in versions]
    if len(set(names)) != len(names):
        raise ImproperlyConfigured(f"{label}: duplicate versions in {names}")
    if sum(v.storage for v in versions) != 1:
        raise ImproperlyConfigured(f"{label}: exactly one version must be storage=True")
    resolved = []
    for v in versions:
        if not _DNS_LABEL.match(v.name):
            raise ImproperlyConfigured(f"{label}: version {v.name!r} must be a DNS label")
        if v.deprecation_warning and not v.deprecated:
            raise ImproperlyConfigured(f"{label}: version {v.name} has a deprecation_warning "
                                       "but is not deprecated")
        resolved.append(dataclasses.replace(
            v, spec=v.spec or resource._spec_field, status=v.status or resource._status_field,
            printer_columns=tuple(v.printer_columns if v.printer_columns is not None
                                  else columns)))
    return tuple(resolved)


def _docstring(resource: type) -> str:
    import inspect

    doc = vars(resource).get("__doc__")
    return inspect.cleandoc(doc) if doc else ""

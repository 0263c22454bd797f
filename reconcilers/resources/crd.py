"""CustomResourceDefinition generation: a ``Resource`` class in, a CRD manifest out.

Purely data-manipulative, no I/O. The output is deterministic: dict keys are built in a fixed
order (``apiVersion, kind, metadata, spec`` at the top, the apiextensions/v1 field order below)
and dumped without sorting, with no timestamps, so regenerating an unchanged resource yields the
same bytes and ``makecrds --check`` can compare files.
"""

from __future__ import annotations

from typing import Any

import yaml

from .base import Resource
from .options import Options, Version

__all__ = ["crd", "openapi_schema", "to_yaml", "render"]

_ROOT_PROPERTIES = {
    "apiVersion": {
        "description": "APIVersion defines the versioned schema of this representation of an "
                       "object.",
        "type": "string",
    },
    "kind": {
        "description": "Kind is a string value representing the REST resource this object "
                       "represents.",
        "type": "string",
    },
    "metadata": {"type": "object"},
}


def openapi_schema(meta: Options, version: Version) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of one version: a structural schema rooted at the object."""
    out: dict[str, Any] = {}
    if meta.description:
        out["description"] = meta.description
    out["type"] = "object"
    properties: dict[str, Any] = {k: dict(v) for k, v in _ROOT_PROPERTIES.items()}
    required = []
    for key, declared in (("spec", version.spec), ("status", version.status)):
        if declared is not None:
            properties[key] = declared.schema()
            if declared.required:
                required.append(key)
    out["properties"] = properties
    if required:
        out["required"] = required
    return out


def _subresources(meta: Options, version: Version) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if version.status is not None and meta.status_subresource:
        out["status"] = {}
    if meta.scale is not None:
        out["scale"] = meta.scale.manifest(version)
    return out


def _version(meta: Options, version: Version) -> dict[str, Any]:
    out: dict[str, Any] = {"name": version.name, "served": version.served,
                           "storage": version.storage}
    if version.deprecated:
        out["deprecated"] = True
        if version.deprecation_warning:
            out["deprecationWarning"] = version.deprecation_warning
    out["schema"] = {"openAPIV3Schema": openapi_schema(meta, version)}
    subresources = _subresources(meta, version)
    if subresources:
        out["subresources"] = subresources
    if version.printer_columns:
        out["additionalPrinterColumns"] = [c.manifest(version) for c in version.printer_columns]
    return out


INJECT_CA_FROM = "cert-manager.io/inject-ca-from"


def crd(resource: type[Resource]) -> dict[str, Any]:
    """The ``apiextensions.k8s.io/v1`` CustomResourceDefinition declaring ``resource``."""
    meta = resource._meta
    names: dict[str, Any] = {"kind": meta.kind, "listKind": meta.list_kind,
                             "plural": meta.plural, "singular": meta.singular}
    if meta.short_names:
        names["shortNames"] = list(meta.short_names)
    if meta.categories:
        names["categories"] = list(meta.categories)
    metadata: dict[str, Any] = {"name": meta.crd_name}
    if meta.labels:
        metadata["labels"] = dict(meta.labels)
    annotations = dict(meta.annotations)
    if meta.converts:
        # cert-manager's CA injector fills the conversion caBundle from the serving
        # Certificate (deploy/webhook/); without cert-manager `webhook register` does.
        namespace, service, _ = meta.webhook_service
        annotations.setdefault(INJECT_CA_FROM, f"{namespace}/{service}")
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {
            "group": meta.group,
            "names": names,
            "scope": meta.scope,
            "versions": [_version(meta, v) for v in meta.versions],
            "conversion": _conversion(meta),
        },
    }


def _conversion(meta) -> dict[str, Any]:
    """Without conversion functions the api-server only rewrites apiVersion between versions
    (fields a version does not declare are pruned when read through it); with them, the
    webhook at ``Meta.webhook_service`` converts (``manage.py webhook register`` adds its CA
    bundle, or points it at a URL)."""
    if not meta.converts:
        return {"strategy": "None"}
    namespace, name, port = meta.webhook_service
    return {"strategy": "Webhook", "webhook": {
        "conversionReviewVersions": ["v1"],
        "clientConfig": {"service": {"namespace": namespace, "name": name, "port": port,
                                     "path": "/convert"}}}}


class _Dumper(yaml.SafeDumper):
    """Block style with list items indented under their key, as kubectl and kubebuilder do."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(document: dict[str, Any]) -> str:
    # No line folding: a long description stays one line, so editing a word changes one line.
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=1 << 16)


def render(resource: type[Resource]) -> str:
    """The manifest file's text: a provenance header (no timestamp) and the CRD as YAML."""
    origin = f"{resource.__module__}.{resource.__qualname__}"
    return (f"# Generated by `manage.py makecrds` from {origin}.\n"
            "# Edit the resource class and regenerate; do not edit this file.\n"
            f"{to_yaml(crd(resource))}")

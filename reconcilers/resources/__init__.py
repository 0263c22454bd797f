"""Custom resources declared in Python: typed classes that generate their CRDs.

One import for users::

    from reconcilers.resources import Resource, Version, PrinterColumn, Scale, fields

Layers, one module each: ``field`` (what every field is: its names, its schema's shared
parts, its rules), ``fields`` (the types and their schemas), ``options`` (versions, printer
columns, subresources, ``Meta``), ``base`` (``Resource``), ``typed`` (attribute access and the
status patch), ``crd`` (CRD dict and deterministic YAML), ``registry`` (declared resources,
``autodiscover``), ``manifests`` (the files ``makecrds`` writes) and ``apply`` (server-side
apply, the only one that talks to the api-server).
"""

from reconcilers._base import renamed

from . import fields
from .apply import NotEstablished, apply_crds
from .base import Resource
from .crd import crd, render
from .options import PrinterColumn, Scale, Version
from .registry import KindRegistry, autodiscover, default_registry

__all__ = [
    "Resource", "fields", "Version", "PrinterColumn", "Scale",
    "KindRegistry", "default_registry", "autodiscover",
    "crd", "render", "apply_crds", "NotEstablished",
]

# Old names still importable for one release, each with a warning naming its successor.
__getattr__ = renamed.lookup(__name__, globals(), {"Registry": "KindRegistry"})

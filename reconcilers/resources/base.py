"""``Resource``: a custom resource kind declared as a class, read like a Django model.

The class is the declaration (it generates the CRD and registers itself on definition); an
instance wraps one API object for typed access::

    class Foo(Resource):
        group = "samplecontroller.k8s.io"
        version = "v1alpha1"
        spec = FooSpec(required=True)
        status = FooStatus()

        class Meta:
            plural = "foos"

    foo = Foo(obj)                      # a deep copy: the cached object is never modified
    foo.spec.replicas, foo.metadata.name
    foo.status.available_replicas = 2
    foo.status_patch()                  # {"status": {"availableReplicas": 2}}
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar, Mapping, Sequence

from django.core.exceptions import ImproperlyConfigured

from .fields import Object
from .options import Options, Version, build_options
from .registry import default_registry
from .typed import MetadataView, ObjectView, merge_patch, root_view

__all__ = ["Resource"]


class Resource:
    """Subclass with ``group``, ``version`` (or ``versions``), optionally ``kind`` (defaults to
    the class name), ``spec`` and ``status`` (``fields.Object`` instances) and a ``Meta``:

    ``plural``, ``singular``, ``short_names``, ``categories``, ``list_kind``, ``scope``
    (``"Namespaced"`` or ``"Cluster"``), ``printer_columns``, ``scale`` (a ``Scale``),
    ``status_subresource`` (default True: status is written only through ``/status``),
    ``labels`` and ``annotations`` (of the CRD itself), ``registry`` (default
    ``default_registry``; ``None`` registers nowhere), ``abstract``.
    """

    group: ClassVar[str]
    kind: ClassVar[str]
    version: ClassVar[str | None] = None
    versions: ClassVar[Sequence[Version | str] | None] = None
    _spec_field: ClassVar[Object | None] = None
    _status_field: ClassVar[Object | None] = None
    _meta: ClassVar[Options]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # spec/status leave the class namespace so the instance properties below stay visible.
        for name in ("spec", "status"):
            declared = vars(cls).get(name)
            if declared is None:
                continue
            if not isinstance(declared, Object):
                raise ImproperlyConfigured(f"{cls.__qualname__}.{name} must be a fields.Object "
                                           f"instance, not {declared!r}")
            setattr(cls, f"_{name}_field", declared.bind(name))
            delattr(cls, name)
        meta = vars(cls).get("Meta")
        if getattr(meta, "abstract", False) and "abstract" in vars(meta):
            return
        cls._meta = build_options(cls, meta, default_registry)
        if cls._meta.registry is not None:
            cls._meta.registry.register(cls)

    def __init__(self, obj: Mapping[str, Any]) -> None:
        self.raw: dict[str, Any] = copy.deepcopy(dict(obj))
        self.schema_version: Version = self._meta.version_for(self.raw.get("apiVersion"))
        self._status_before = copy.deepcopy(self.raw.get("status"))

    @property
    def api_version(self) -> str:
        return self.raw.get("apiVersion") or f"{self._meta.group}/{self.schema_version.name}"

    @property
    def metadata(self) -> MetadataView:
        return MetadataView(self.raw.get("metadata") or {})

    @property
    def spec(self) -> ObjectView:
        return self._view("spec", self.schema_version.spec)

    @property
    def status(self) -> ObjectView:
        return self._view("status", self.schema_version.status)

    def _view(self, key: str, declared: Object | None) -> ObjectView:
        if declared is None:
            raise AttributeError(f"{type(self).__name__} {self.schema_version.name} declares "
                                 f"no {key}")
        return root_view(declared, self.raw, key)

    def status_patch(self) -> dict[str, Any]:
        """The JSON merge patch (for the status subresource) of every status change made since
        this object was wrapped; ``{}`` when nothing changed, so callers can skip the request."""
        before, after = self._status_before, self.raw.get("status")
        if before == after:
            return {}
        if not isinstance(before, dict) or not isinstance(after, dict):
            return {"status": copy.deepcopy(after)}
        return {"status": merge_patch(before, after)}

    def __repr__(self) -> str:
        meta = self.raw.get("metadata") or {}
        where = f"{meta['namespace']}/" if meta.get("namespace") else ""
        return f"<{type(self).__name__} {where}{meta.get('name', '?')}>"

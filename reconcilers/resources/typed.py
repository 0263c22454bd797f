"""Typed access to an API object: attribute access by Python names over the raw JSON dict.

Views hold no copy: reads and writes go straight to the wrapped dict (``Resource.raw``), so a
change through a view is a change of the object, and ``Resource.status_patch()`` finds it by
diffing. A view of something absent (``status`` on a new object, an empty list) reads as empty
and creates its container on the first write. A nested object that is absent reads as ``None``.
"""

from __future__ import annotations

import copy
from collections.abc import MutableMapping, MutableSequence
from typing import Any, Iterator

from .field import Field, camel_case
from .fields import List, Map, Object

__all__ = ["ObjectView", "ListView", "MapView", "MetadataView", "merge_patch", "root_view"]


class _Root:
    """The parent of a top-level view: the whole object dict."""

    __slots__ = ("_obj",)

    def __init__(self, obj: dict[str, Any]) -> None:
        self._obj = obj

    def _data(self) -> dict[str, Any]:
        return self._obj

    def _ensure(self) -> dict[str, Any]:
        return self._obj


class _View:
    """A value that lives at ``parent[key]``; ``_ensure`` creates it (and its parents)."""

    __slots__ = ("_field", "_parent", "_key")
    _empty: type = dict

    def __init__(self, field: Field, parent: Any, key: str | int) -> None:
        object.__setattr__(self, "_field", field)
        object.__setattr__(self, "_parent", parent)
        object.__setattr__(self, "_key", key)

    def _data(self) -> Any:
        container = self._parent._data()
        if container is None:
            return None
        if isinstance(container, dict):
            return container.get(self._key)
        return container[self._key]

    def _ensure(self) -> Any:
        container = self._parent._ensure()
        if isinstance(container, dict) and container.get(self._key) is None:
            container[self._key] = self._empty()
        return container[self._key]

    def __json__(self) -> Any:
        """A copy of the JSON value, so assigning a view never aliases two places."""
        return copy.deepcopy(self._data())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _View):
            return self._data() == other._data()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def read(field: Field, parent: Any, key: str | int) -> Any:
    """The Python value of ``parent[key]`` as declared by ``field``."""
    if isinstance(field, List):
        return ListView(field, parent, key)
    if isinstance(field, Map):
        return MapView(field, parent, key)
    value = _View(field, parent, key)._data()
    if value is None:
        return copy.deepcopy(field.default) if field.has_default and not isinstance(
            field, Object) else None
    if isinstance(field, Object):
        return ObjectView(field, parent, key)
    return field.to_python(value)


def _write(field: Field, parent: Any, key: str | int, value: Any) -> None:
    if value is None:
        container = parent._data()
        if isinstance(container, dict):
            container.pop(key, None)
        elif container is not None:
            container[key] = None
        return
    parent._ensure()[key] = field.to_json(value)


class ObjectView(_View):
    """Attribute access to a declared ``fields.Object``; unknown names raise AttributeError."""

    __slots__ = ()

    def _declared(self, name: str) -> Field:
        found = self._field.declared_fields.get(name)
        if found is None:
            raise AttributeError(f"{type(self._field).__name__} has no field {name!r} "
                                 f"(declared: {', '.join(self._field.declared_fields) or 'none'})")
        return found

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        f = self._declared(name)
        return read(f, self, f.json_name)

    def __setattr__(self, name: str, value: Any) -> None:
        f = self._declared(name)
        _write(f, self, f.json_name, value)

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    def __dir__(self) -> list[str]:
        return list(self._field.declared_fields)

    def __repr__(self) -> str:
        return f"<{type(self._field).__name__} {self._data()!r}>"


def root_view(field: Object, obj: dict[str, Any], key: str) -> ObjectView:
    """The view of ``obj[key]`` (``spec`` or ``status``), created on first write."""
    return ObjectView(field, _Root(obj), key)


class ListView(_View, MutableSequence):
    """A declared ``fields.List``: items converted on the way in and out."""

    __slots__ = ()
    _empty = list

    def _items(self) -> list[Any]:
        return self._data() or []

    def __len__(self) -> int:
        return len(self._items())

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        items = self._items()
        return read(self._field.item, self, range(len(items))[index])

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            self._ensure()[index] = [self._field.item.to_json(v) for v in value]
        else:
            self._ensure()[index] = self._field.item.to_json(value)

    def __delitem__(self, index: Any) -> None:
        del self._ensure()[index]

    def insert(self, index: int, value: Any) -> None:
        self._ensure().insert(index, self._field.item.to_json(value))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return super().__eq__(other)

    def __repr__(self) -> str:
        return repr(list(self))


class MapView(_View, MutableMapping):
    """A declared ``fields.Map``: string keys, values converted on the way in and out."""

    __slots__ = ()

    def _items(self) -> dict[str, Any]:
        return self._data() or {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._items():
            raise KeyError(key)
        return read(self._field.value, self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"map keys are strings, got {key!r}")
        self._ensure()[key] = self._field.value.to_json(value)

    def __delitem__(self, key: str) -> None:
        if key not in self._items():
            raise KeyError(key)
        del self._ensure()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items()))

    def __len__(self) -> int:
        return len(self._items())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dict):
            return dict(self) == other
        return super().__eq__(other)

    def __repr__(self) -> str:
        return repr(dict(self))


class MetadataView:
    """Read-only ``metadata`` by snake_case names: ``name``, ``namespace``, ``labels``,
    ``resource_version``, ``generation``, ``owner_references``... (absent -> ``None``)."""

    __slots__ = ("_meta",)

    def __init__(self, meta: dict[str, Any]) -> None:
        object.__setattr__(self, "_meta", meta)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._meta.get(camel_case(name))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("metadata is read-only here; patch the object to change it")

    def __repr__(self) -> str:
        return f"<metadata {self._meta!r}>"


def merge_patch(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The RFC 7386 JSON merge patch turning ``before`` into ``after``: removed keys become
    ``None`` and lists are replaced whole (merge patches cannot address list items)."""
    patch: dict[str, Any] = {key: None for key in before if key not in after}
    for key, value in after.items():
        old = before.get(key, _MISSING)
        if old == value:
            continue
        if isinstance(old, dict) and isinstance(value, dict):
            patch[key] = merge_patch(old, value)
        else:
            patch[key] = copy.deepcopy(value)
    return patch


_MISSING = object()

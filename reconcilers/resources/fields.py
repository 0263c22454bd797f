"""Typed fields: the types a custom resource's spec and status are declared with, each knowing
its OpenAPI v3 schema and how its values look in JSON and Python.

Purely data-manipulative, no I/O. The rule: a value becomes JSON only if it has its field's
type - else a ``TypeError`` (a ``ValueError`` for a value outside an ``Enum``'s choices, or a
naive datetime) - and a flag never passes as a count. What every field shares (names, schema
order, defaults, CEL ``Rule``s) is ``field``'s; its public names are here too, so ``fields`` is
the one module an author declares with.
"""

from __future__ import annotations

import copy
import enum
from datetime import datetime, timezone
from typing import Any, ClassVar, Iterable, Mapping

from .field import NOT_PROVIDED, Field, Rule, camel_case, put as _put

__all__ = [
    "Rule", "Field", "String", "Integer", "Number", "Boolean", "Enum", "DateTime", "Quantity",
    "IntOrString", "List", "Map", "Object", "camel_case", "NOT_PROVIDED",
]

# The pattern controller-gen emits for resource.Quantity ("500m", "1Gi", "2", "1e3").
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _plain(value: Any) -> Any:
    """Typed views (see ``typed``) hand over a copy of their JSON value."""
    to_json = getattr(value, "__json__", None)
    return to_json() if to_json is not None else value


def _check_type(field: Field, value: Any, types: tuple[type, ...]) -> Any:
    # bool is an int subclass; a flag must never pass as a count.
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        raise TypeError(f"{field.name or type(field).__name__}: expected "
                        f"{'/'.join(t.__name__ for t in types)}, got {value!r}")
    return value


class String(Field):
    def __init__(self, *, pattern: str | None = None, min_length: int | None = None,
                 max_length: int | None = None, format: str | None = None, **options: Any):
        self.pattern, self.format = pattern, format
        self.min_length, self.max_length = min_length, max_length
        super().__init__(**options)

    def type_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "string"}
        _put(out, "format", self.format)
        _put(out, "pattern", self.pattern)
        _put(out, "minLength", self.min_length)
        _put(out, "maxLength", self.max_length)
        return out

    def to_json(self, value: Any) -> Any:
        return _check_type(self, value, (str,))


class _Bounded(Field):
    json_type: ClassVar[str]

    def __init__(self, *, minimum: float | None = None, maximum: float | None = None,
                 **options: Any):
        self.minimum, self.maximum = minimum, maximum
        super().__init__(**options)

    def type_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.json_type}
        _put(out, "minimum", self.minimum)
        _put(out, "maximum", self.maximum)
        return out


class Integer(_Bounded):
    json_type = column_type = "integer"

    def to_json(self, value: Any) -> Any:
        return _check_type(self, value, (int,))


class Number(_Bounded):
    json_type = column_type = "number"

    def to_json(self, value: Any) -> Any:
        return _check_type(self, value, (int, float))


class Boolean(Field):
    column_type = "boolean"

    def type_schema(self) -> dict[str, Any]:
        return {"type": "boolean"}

    def to_json(self, value: Any) -> Any:
        return _check_type(self, value, (bool,))


class Enum(Field):
    """One of fixed values: a list of strings (or integers), or a Python ``enum.Enum`` class.

    With an ``enum.Enum`` class, typed access returns its members.
    """

    def __init__(self, choices: Iterable[str | int] | type[enum.Enum], **options: Any):
        self.enum_class = choices if isinstance(choices, type) else None
        values = [m.value for m in choices] if self.enum_class else list(choices)
        if not values:
            raise TypeError("Enum needs at least one choice")
        if all(isinstance(v, str) for v in values):
            self.enum_type = "string"
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            self.enum_type = "integer"
        else:
            raise TypeError(f"Enum choices must be all strings or all integers: {values!r}")
        self.choices = values
        super().__init__(**options)

    @property
    def column_type(self) -> str:  # type: ignore[override]
        return self.enum_type

    def type_schema(self) -> dict[str, Any]:
        return {"type": self.enum_type, "enum": list(self.choices)}

    def to_python(self, value: Any) -> Any:
        if self.enum_class is not None and value in self.choices:
            return self.enum_class(value)
        return value

    def to_json(self, value: Any) -> Any:
        if isinstance(value, enum.Enum):
            value = value.value
        if value not in self.choices:
            raise ValueError(f"{self.name}: {value!r} is not one of {self.choices!r}")
        return value


class DateTime(Field):
    """An RFC 3339 timestamp; Python sees an aware ``datetime``."""

    column_type = "date"

    def type_schema(self) -> dict[str, Any]:
        return {"type": "string", "format": "date-time"}

    def to_python(self, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value

    def to_json(self, value: Any) -> Any:
        if isinstance(value, str):
            return value
        if not isinstance(value, datetime):
            raise TypeError(f"{self.name}: expected datetime or str, got {value!r}")
        if value.tzinfo is None:
            raise ValueError(f"{self.name}: a naive datetime has no timezone; use an aware one")
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class IntOrString(Field):
    """An integer or a string (``intstr.IntOrString``: ports by number or name, "25%")."""

    def type_schema(self) -> dict[str, Any]:
        return {"anyOf": [{"type": "integer"}, {"type": "string"}]}

    def extensions(self) -> dict[str, Any]:
        return {"x-kubernetes-int-or-string": True}

    def to_json(self, value: Any) -> Any:
        return _check_type(self, value, (int, str))


class Quantity(IntOrString):
    """A Kubernetes quantity (``resource.Quantity``): ``2``, ``500m``, ``1Gi``."""

    def type_schema(self) -> dict[str, Any]:
        return {**super().type_schema(), "pattern": QUANTITY_PATTERN}


class List(Field):
    """A list of ``item``. ``unique`` makes it a ``set`` (scalars only: the api-server forbids
    ``uniqueItems``); ``map_keys`` makes a list of objects a ``map`` keyed by those fields, so
    server-side apply merges items by key instead of replacing the list."""

    scalar = False

    def __init__(self, item: Field, *, min_items: int | None = None,
                 max_items: int | None = None, unique: bool = False,
                 map_keys: Iterable[str] | None = None, **options: Any):
        if unique and map_keys:
            raise TypeError("a list is either unique (a set) or keyed (map_keys), not both")
        if unique and not item.scalar:
            raise TypeError("unique lists must hold scalars (x-kubernetes-list-type: set)")
        self.map_keys = [_map_key(item, key) for key in map_keys or ()]
        self.item = item
        self.min_items, self.max_items, self.unique = min_items, max_items, unique
        super().__init__(**options)

    def type_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array", "items": self.item.schema()}
        _put(out, "minItems", self.min_items)
        _put(out, "maxItems", self.max_items)
        return out

    def extensions(self) -> dict[str, Any]:
        if self.unique:
            return {"x-kubernetes-list-type": "set"}
        if self.map_keys:
            return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": self.map_keys}
        return {}

    def to_json(self, value: Any) -> Any:
        value = _plain(value)
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
            raise TypeError(f"{self.name}: expected a list, got {value!r}")
        return [self.item.to_json(v) for v in value]


class Map(Field):
    """String keys to values of one type (``additionalProperties``): labels, env, limits."""

    scalar = False

    def __init__(self, value: Field, **options: Any):
        self.value = value
        super().__init__(**options)

    def type_schema(self) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": self.value.schema()}

    def to_json(self, value: Any) -> Any:
        value = _plain(value)
        if not isinstance(value, Mapping):
            raise TypeError(f"{self.name}: expected a mapping, got {value!r}")
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{self.name}: map keys are strings, got {list(value)!r}")
        return {k: self.value.to_json(v) for k, v in value.items()}


def _map_key(item: Field, key: str) -> str:
    """The JSON name of a list-map key: the api-server needs a required or defaulted scalar."""
    found = item.field_for(key) if isinstance(item, Object) else None
    if found is None or not found.scalar or not (found.required or found.has_default):
        raise TypeError(f"map key {key!r} must name a required (or defaulted) scalar field "
                        f"of the list's objects")
    return found.json_name


class Object(Field):
    """A nested object: subclass it and declare fields as class attributes, like a model.

    ``preserve_unknown_fields=True`` keeps fields the schema does not declare (otherwise the
    api-server prunes them); use it only for genuinely free-form data.
    """

    scalar = False
    #: The declared fields by Python name, in declaration order (base classes first).
    declared_fields: ClassVar[dict[str, Field]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = dict(cls.declared_fields)
        for name, value in list(vars(cls).items()):
            if isinstance(value, Field):
                declared[name] = value.bind(name)
                delattr(cls, name)
        by_json: dict[str, str] = {}
        for name, f in declared.items():
            if f.json_name in by_json:
                raise TypeError(f"{cls.__name__}: fields {by_json[f.json_name]!r} and {name!r} "
                                f"share the JSON name {f.json_name!r}")
            by_json[f.json_name] = name
        cls.declared_fields = declared

    def __init__(self, *, preserve_unknown_fields: bool = False, **options: Any):
        self.preserve_unknown_fields = preserve_unknown_fields
        super().__init__(**options)

    def type_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object"}
        if self.declared_fields:
            out["properties"] = {f.json_name: f.schema() for f in self.declared_fields.values()}
        required = [f.json_name for f in self.declared_fields.values() if f.required]
        if required:
            out["required"] = required
        return out

    def extensions(self) -> dict[str, Any]:
        return {"x-kubernetes-preserve-unknown-fields": True} if self.preserve_unknown_fields \
            else {}

    def field_for(self, name: str) -> Field | None:
        """The declared field called ``name`` in Python or in JSON."""
        found = self.declared_fields.get(name)
        if found is None:
            found = next((f for f in self.declared_fields.values() if f.json_name == name), None)
        return found

    def to_json(self, value: Any) -> Any:
        """A mapping keyed by Python or JSON names; undeclared keys pass through unchanged."""
        value = _plain(value)
        if not isinstance(value, Mapping):
            raise TypeError(f"{self.name or type(self).__name__}: expected a mapping, "
                            f"got {value!r}")
        out = {}
        for key, item in value.items():
            f = self.field_for(key)
            if f is None:
                out[key] = copy.deepcopy(item)
            elif item is not None:
                out[f.json_name] = f.to_json(item)
        return out

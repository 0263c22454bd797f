"""``Field``: what every field of a custom resource is, whatever its type - its names, its
schema's shared parts, its CEL rules.

Purely data-manipulative, no I/O. The rules: attribute names are snake_case; the JSON name
defaults to the lowerCamelCase conversion (``deployment_name`` -> ``deploymentName``, a
trailing underscore dropped so ``class_`` -> ``class``) and ``json_name=`` overrides it. A
default is given in Python form and stored in JSON form. Schemas are built as dicts in a fixed
key order (description first, then the type and its constraints, then default/nullable and the
``x-kubernetes-*`` extensions) so generated manifests are byte-for-byte stable. The types
themselves, each with its schema and its values in JSON and Python, are ``fields``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence


@dataclass(frozen=True)
class Rule:
    """A CEL validation rule (``x-kubernetes-validations``), checked by the api-server on
    every write - cross-field rules and transition rules the OpenAPI schema cannot say.

    ``Rule("self.minReplicas <= self.maxReplicas", "minReplicas may not exceed maxReplicas")``
    on an object; ``self`` is the field's value, ``oldSelf`` its stored value on an update
    (such a transition rule only runs when both exist). ``field_path`` points the error at a
    child (``.maxReplicas``); ``reason`` is one of ``FieldValueInvalid`` (the default),
    ``FieldValueForbidden``, ``FieldValueRequired``, ``FieldValueDuplicate``.
    """

    rule: str
    message: str = ""
    field_path: str = ""
    reason: str = ""

    def schema(self) -> dict[str, str]:
        out = {"rule": self.rule}
        put(out, "message", self.message or None)
        put(out, "fieldPath", self.field_path or None)
        put(out, "reason", self.reason or None)
        return out


class _NotProvided:
    def __repr__(self) -> str:
        return "NOT_PROVIDED"


NOT_PROVIDED: Any = _NotProvided()


def camel_case(name: str) -> str:
    """``deployment_name`` -> ``deploymentName``; ``class_`` -> ``class``."""
    head, *rest = name.rstrip("_").split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class Field:
    """One value in a resource's spec or status.

    ``required`` puts the name in the parent object's ``required`` list; ``default`` is applied
    by the api-server (given in Python form, stored in JSON form); ``help_text`` becomes the
    schema's ``description`` (what ``kubectl explain`` shows); ``nullable`` keeps an explicit
    ``null`` instead of pruning it. ``immutable`` makes the api-server refuse any change of
    the value once set (a CEL transition rule); ``rules`` adds CEL ``Rule``s of your own.
    """

    #: The additionalPrinterColumns type a column showing this field gets.
    column_type: ClassVar[str] = "string"
    #: Whether the value is a scalar (only scalars may be items of a ``set`` list).
    scalar: ClassVar[bool] = True

    def __init__(self, *, required: bool = False, default: Any = NOT_PROVIDED,
                 help_text: str = "", json_name: str | None = None,
                 nullable: bool = False, immutable: bool = False,
                 rules: Sequence[Rule] = ()) -> None:
        self.name: str | None = None
        self.immutable = immutable
        self.rules = tuple(rules)
        self.required = required
        self.help_text = help_text
        self.nullable = nullable
        self._json_name = json_name
        self.default = default if default is NOT_PROVIDED else self.to_json(default)

    @property
    def json_name(self) -> str:
        if self._json_name:
            return self._json_name
        if self.name is None:
            raise AttributeError(f"{self!r} is not bound to a name")
        return camel_case(self.name)

    @property
    def has_default(self) -> bool:
        return self.default is not NOT_PROVIDED

    def bind(self, name: str) -> Field:
        """A copy of this field named ``name`` (a declaration may be reused elsewhere)."""
        if name.startswith("_"):
            raise TypeError(f"field names may not start with an underscore: {name!r}")
        bound = copy.copy(self)
        bound.name = name
        return bound

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.help_text:
            out["description"] = self.help_text
        out.update(self.type_schema())
        if self.has_default:
            out["default"] = copy.deepcopy(self.default)
        if self.nullable:
            out["nullable"] = True
        out.update(self.extensions())
        validations = [r.schema() for r in self.validation_rules()]
        if validations:
            out["x-kubernetes-validations"] = validations
        return out

    def validation_rules(self) -> list[Rule]:
        immutable = [Rule("self == oldSelf", f"{self.json_name} is immutable")] \
            if self.immutable else []
        return [*immutable, *self.rules]

    def type_schema(self) -> dict[str, Any]:
        raise NotImplementedError

    def extensions(self) -> dict[str, Any]:
        return {}

    def to_python(self, value: Any) -> Any:
        """The JSON value as user code sees it."""
        return value

    def to_json(self, value: Any) -> Any:
        """The Python value as the API stores it."""
        return value

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name or '(unbound)'}>"


def put(out: dict[str, Any], key: str, value: Any) -> None:
    """``out[key] = value`` unless ``value`` is None: a schema names only what was given."""
    if value is not None:
        out[key] = value

"""What a dependent is, and the order of a graph of them: declarations only, no I/O.

``Dependent`` is one child's declaration; ``order`` sorts a workflow's so that each comes
after what it depends on, refusing what could never run (a duplicate name, an unknown one, a
cycle) - when the reconciler's class is defined, not in a run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from reconcilers._base.callables import positional_count

if TYPE_CHECKING:  # pragma: no cover
    from reconcilers._kube.context import Context

# The label every child carries: the name of the dependent that made it.
LABEL = "reconcilers.django-crd-operator.io/dependent"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Dependent:
    """One child: ``name`` (unique in its workflow; a label value), its ``api_version`` and
    ``kind``, and ``desired(obj)`` or ``desired(obj, ctx)`` returning its manifest - ``metadata.
    name`` at least; apiVersion, kind, namespace, the owner reference and the label are filled
    in.

    ``ready(child) -> bool``: when it counts as ready (default: once applied).
    ``depends_on``: names of dependents that must be ready before this one is applied, and
    that are deleted only after it.
    ``when(obj) -> bool``: whether it is wanted at all (java-operator-sdk's reconcile
    precondition; default: always). Not wanted, it and what depends on it are deleted.
    ``force``: server-side apply takes over fields other managers set (controllers' usual
    choice; ``False``: such a conflict is an error, retried).
    ``propagation``: the deletion's ``propagationPolicy`` - ``"Background"`` (the API's
    default for most kinds) or ``"Foreground"``: the child stays until its own children (a
    Deployment's Pods) are gone, so "deleted before what it depends on" includes them.
    """

    name: str
    api_version: str
    kind: str
    desired: Callable[..., Mapping]
    ready: Callable[[dict], bool] | None = None
    depends_on: Sequence[str] = ()
    when: Callable[[Any], bool] | None = None
    plural: str | None = None
    force: bool = True
    propagation: str = "Background"

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"dependent name {self.name!r} must be a DNS label (lower-case "
                             f"letters, digits and '-', at most 63): it is a label value")
        if isinstance(self.depends_on, str):
            object.__setattr__(self, "depends_on", (self.depends_on,))
        object.__setattr__(self, "depends_on", tuple(self.depends_on))
        if self.propagation not in ("Background", "Foreground"):
            raise ValueError(f"dependent {self.name!r}: propagation must be 'Background' or "
                             f"'Foreground', not {self.propagation!r}")

    @property
    def condition(self) -> str:
        """Its status condition type: ``server`` -> ``ServerReady``."""
        return "".join(part.capitalize() for part in self.name.split("-")) + "Ready"

    def manifest(self, obj: Any, ctx: "Context") -> dict:
        """``desired`` completed with apiVersion, kind and the dependent's label."""
        body = dict(self.desired(obj, ctx) if positional_count(self.desired) >= 2 else self.desired(obj))
        for field_, value in (("apiVersion", self.api_version), ("kind", self.kind)):
            if body.setdefault(field_, value) != value:
                raise ValueError(f"dependent {self.name!r} is a {self.api_version} {self.kind}, "
                                 f"but desired() returned {field_} {body[field_]!r}")
        meta = dict(body.get("metadata") or {})
        if not meta.get("name"):
            raise ValueError(f"dependent {self.name!r}: desired() returned no metadata.name")
        meta["labels"] = {**(meta.get("labels") or {}), LABEL: self.name}
        body["metadata"] = meta
        return body


def order(dependents: Sequence[Dependent]) -> list[Dependent]:
    """The dependents in an order that puts each after everything it depends on (declaration
    order among the free ones). Raises ``ValueError`` for a duplicate name, an unknown
    ``depends_on`` or a cycle (named: ``a -> b -> a``, a depending on b)."""
    by_name: dict[str, Dependent] = {}
    for dep in dependents:
        if dep.name in by_name:
            raise ValueError(f"two dependents are named {dep.name!r}")
        by_name[dep.name] = dep
    for dep in dependents:
        for parent in dep.depends_on:
            if parent not in by_name:
                raise ValueError(f"dependent {dep.name!r} depends on {parent!r}, which is not "
                                 f"declared (declared: {', '.join(by_name)})")
    cycle = _find_cycle(by_name)
    if cycle:
        raise ValueError(f"dependents form a cycle: {' -> '.join(cycle)} (each depends on the "
                         f"next); nothing in it could ever be applied first")
    out: list[Dependent] = []
    placed: set[str] = set()
    while len(out) < len(dependents):
        for dep in dependents:  # no cycle: each pass places at least one
            if dep.name not in placed and placed.issuperset(dep.depends_on):
                out.append(dep)
                placed.add(dep.name)
    return out


def _find_cycle(by_name: Mapping[str, Dependent]) -> list[str]:
    """One cycle of the ``depends_on`` graph as a closed path, or ``[]``."""
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> list[str]:
        if name in visiting:
            return visiting[visiting.index(name):] + [name]
        if name in done:
            return []
        visiting.append(name)
        for parent in by_name[name].depends_on:
            found = visit(parent)
            if found:
                return found
        visiting.pop()
        done.add(name)
        return []

    for name in by_name:
        found = visit(name)
        if found:
            return found
    return []

"""From a change of an object to the keys it should reconcile (client-go's event handlers).

A ``Handler`` binds one reconciler to one watched resource: the primary resource maps to its
own key (after the reconciler's predicates), an owned resource maps to its controller owner's
key (``ownerReferences`` with ``controller: true``). A ``Router`` runs every handler of a
stream for each change the reflector reports and hands the keys on. Pure mapping: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .models import Trigger
from .spec import Reconciler
from .vocab import Key

PRIMARY, OWNED = "primary", "owned"


@dataclass(frozen=True)
class Handler:
    reconciler: type[Reconciler]
    role: str  # PRIMARY | OWNED

    def keys_for(self, old: dict | None, new: dict | None) -> list[Key]:
        name = self.reconciler.name()
        if self.role == PRIMARY:
            meta = (new or old or {})["metadata"]
            return [Key(name, meta.get("namespace") or "", meta["name"])]
        primary = self.reconciler.primary()
        out: list[Key] = []
        for obj in (old, new):
            for ref in ((obj or {}).get("metadata") or {}).get("ownerReferences") or []:
                if (ref.get("controller") and ref.get("kind") == primary.kind
                        and ref.get("apiVersion", "").rpartition("/")[0] == primary.group):
                    ns = (obj["metadata"].get("namespace") or "") if primary.namespaced else ""
                    key = Key(name, ns, ref["name"])
                    if key not in out:
                        out.append(key)
        return out

    def passes(self, old: dict | None, new: dict | None) -> bool:
        if self.role != PRIMARY:
            return True
        return all(p(old, new) for p in self.reconciler.predicates)


class Router:
    """Maps each change to keys through every handler; ``skipped`` counts predicate drops.

    ``put(key, trigger)`` receives the keys; ``done(change)`` follows them, so whoever
    receives both in order knows when every key of a journalled change has been handed on.
    """

    def __init__(self, handlers: Sequence[Handler], put: Callable[[Key, str], None],
                 done: Callable[[Any], None] = lambda change: None):
        self.handlers = list(handlers)
        self.put = put
        self.done = done
        self.skipped = 0

    def __call__(self, trigger: str, old: dict | None, new: dict | None,
                 change: Any = None) -> None:
        for handler in self.handlers:
            if handler.role == OWNED:
                trig = Trigger.OWNED
            elif not handler.passes(old, new):
                self.skipped += 1
                continue
            else:
                trig = trigger
            for key in handler.keys_for(old, new):
                self.put(key, trig)
        if change is not None:
            self.done(change)

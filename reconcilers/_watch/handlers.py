"""From a change of an object to the keys it should reconcile (client-go's event handlers).

A ``Handler`` binds one reconciler to one watched resource: the primary resource maps to its
own key, an owned resource (``Owns``) maps to its controller owner's key (``ownerReferences``
with ``controller: true``), a related resource (``Watches``) maps to the keys its map function
names - each after its own declaration's predicates (the reconciler's, the ``Owns``', the
``Watches'``). A ``Router`` runs every handler of a stream for each change the reflector
reports and hands the keys on. Predicates drop keys, never cache writes: the reflector keeps
every change, and skips only the journal entry of one no handler of the stream lets through.
Mapping only: the one read is a ``Watches`` map function's, through a ``Lister`` (the shared
cache, else the api-server).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from reconcilers._kube import kube
from reconcilers._kube.lister import Lister
from reconcilers._base.reconcile import Key, Trigger
from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base import predicates
from reconcilers._base.callables import positional_count
from reconcilers._base.vocab import Owns, Watches

log = logging.getLogger(__name__)

PRIMARY, OWNED, WATCHED = "primary", "owned", "watched"
TRIGGERS = {OWNED: Trigger.OWNED, WATCHED: Trigger.WATCHED}


@dataclass(frozen=True)
class Handler:
    reconciler: type[Reconciler]
    role: str  # PRIMARY | OWNED | WATCHED
    declaration: Owns | Watches | None = None  # the Owns of OWNED, the Watches of WATCHED

    def keys_for(self, old: dict | None, new: dict | None) -> list[Key]:
        name = self.reconciler.name()
        if self.role == PRIMARY:
            meta = (new or old or {})["metadata"]
            return [Key(name, meta.get("namespace") or "", meta["name"])]
        if self.role == WATCHED:
            return self._mapped(old, new)
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

    def _mapped(self, old: dict | None, new: dict | None) -> list[Key]:
        """The keys the map function names for either state of the object. A map function
        that raises maps the change to nothing (logged): a bad object never stops the stream."""
        name, namespaced = self.reconciler.name(), self.reconciler.primary().namespaced
        out: list[Key] = []
        for obj in (old, new):
            if obj is None:
                continue
            try:
                targets = list(self._map(obj) or ())
            except Exception:
                log.exception("%s: the map function of Watches(%s) failed on %s", name,
                              self.declaration.kind, obj.get("metadata", {}).get("name"))
                continue
            for target in targets:
                ns, obj_name = (target if isinstance(target, tuple)
                                else (obj["metadata"].get("namespace") or "", target))
                key = Key(name, (ns or "") if namespaced else "", obj_name)
                if key not in out:
                    out.append(key)
        return out

    def _map(self, obj: dict):
        """``map(obj)``, or ``map(obj, lister)`` for a map function that reads (say, the
        objects whose selector matches ``obj``)."""
        if positional_count(self.declaration.map) >= 2:
            cls = self.reconciler
            return self.declaration.map(obj, Lister(kube.api_client(), cls.watched(),
                                                    cls.indexes, cls.cache_scopes()))
        return self.declaration.map(obj)

    def passes(self, old: dict | None, new: dict | None) -> bool:
        """Whether this handler's predicates let the change through (``predicates.passes``:
        a predicate that fails is logged and counts as passing)."""
        if self.role == PRIMARY:
            declared, where = self.reconciler.predicates, f"{self.reconciler.name()} predicates"
        elif self.declaration is not None:
            declared = self.declaration.predicates
            where = (f"{self.reconciler.name()} {type(self.declaration).__name__}"
                     f"({self.declaration.api_version}, {self.declaration.kind})")
        else:
            return True
        return predicates.passes(declared, old, new, where) if declared else True


class Router:
    """Maps each change to keys through every handler; ``skipped`` counts predicate drops
    (one per handler and change), ``skipped_for(name)`` the changes none of that reconciler's
    handlers let through - what its row of the stream's status shows, since predicates are
    per declaration and a stream may serve several reconcilers.

    ``put(key, trigger)`` receives the keys; ``done(change)`` follows them, so whoever
    receives both in order knows when every key of a journalled change has been handed on.
    """

    def __init__(self, handlers: Sequence[Handler], put: Callable[[Key, str], None],
                 done: Callable[[Any], None] = lambda change: None):
        self.handlers = list(handlers)
        self.put = put
        self.done = done
        self.skipped = 0
        self._skipped_by: dict[str, int] = {}
        self._asked: tuple[Any, Any, list[Handler]] | None = None

    def skipped_for(self, reconciler: str) -> int:
        return self._skipped_by.get(reconciler, 0)

    def wants(self, old: dict | None, new: dict | None) -> bool:
        """Whether any handler's predicates let this change through. The answer is kept for
        the delivery of the same change that follows, so predicates run once per change."""
        passing = [h for h in self.handlers if h.passes(old, new)]
        self._asked = (old, new, passing)
        return bool(passing)

    def __call__(self, trigger: str, old: dict | None, new: dict | None,
                 change: Any = None) -> None:
        asked, self._asked = self._asked, None
        if asked is not None and asked[0] is old and asked[1] is new:
            passing = asked[2]
        else:
            passing = [h for h in self.handlers if h.passes(old, new)]
        self.skipped += len(self.handlers) - len(passing)
        if len(passing) < len(self.handlers):
            reached = {h.reconciler.name() for h in passing}
            for name in {h.reconciler.name() for h in self.handlers} - reached:
                self._skipped_by[name] = self._skipped_by.get(name, 0) + 1
        for handler in passing:
            trig = TRIGGERS.get(handler.role, trigger)
            for key in handler.keys_for(old, new):
                self.put(key, trig)
        if change is not None:
            self.done(change)

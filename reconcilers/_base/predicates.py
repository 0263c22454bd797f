"""Event filters applied by the watcher before a key is enqueued.

A predicate is ``(old, new) -> bool`` over API bodies; ``old`` is the cached object (``None`` for
an object not seen before) and ``new`` the one in the event (``None`` on deletion). A reconciler
declares them for its primary resource (``predicates``) and for each ``Owns`` and ``Watches``;
every predicate of one declaration must pass. The built-in ones let additions and deletions
through: filters are for updates, where most of the noise is (status writes, resyncs).

``check`` refuses a declaration that could never work when the class is defined; ``passes``
runs them for the watcher. A predicate that fails at run time (it raises, or returns ``None``
or a function) is a bug in it, not a verdict: the change is let through and the error logged.
Dropping it instead would lose the change without a trace until the next resync, while an
extra reconcile of a level-based reconciler costs one run.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Mapping, Sequence

from reconcilers._base.vocab import Predicate

log = logging.getLogger(__name__)

Body = Mapping


def _meta(obj: Body | None) -> Mapping:
    return (obj or {}).get("metadata") or {}


def generation_changed(old: Body | None, new: Body | None) -> bool:
    """Skip updates that leave ``metadata.generation`` alone (status-only writes)."""
    if old is None or new is None:
        return True
    deleting = _meta(new).get("deletionTimestamp") and not _meta(old).get("deletionTimestamp")
    return bool(deleting) or _meta(old).get("generation") != _meta(new).get("generation")


def labels_changed(old: Body | None, new: Body | None) -> bool:
    if old is None or new is None:
        return True
    return _meta(old).get("labels") != _meta(new).get("labels")


def annotations_changed(old: Body | None, new: Body | None) -> bool:
    if old is None or new is None:
        return True
    return _meta(old).get("annotations") != _meta(new).get("annotations")


def any_of(*predicates: Predicate) -> Predicate:
    """Pass when at least one of ``predicates`` passes (e.g. generation or labels changed)."""

    def check(old: Body | None, new: Body | None) -> bool:
        return any(p(old, new) for p in predicates)

    check.__name__ = "any_of(" + ", ".join(p.__name__ for p in predicates) + ")"
    return check


def check(declared: Any, where: str) -> tuple[Predicate, ...]:
    """``declared`` as a tuple of predicates, or a ``TypeError`` naming ``where`` and the
    mistake: one predicate rather than a list, something not callable, a factory not called
    (``any_of`` rather than ``any_of(a, b)``), a function that cannot take ``(old, new)``."""
    if callable(declared) or isinstance(declared, (str, bytes, Mapping)):
        name = getattr(declared, "__name__", repr(declared))
        raise TypeError(f"{where}: predicates takes a list of predicates, not {name!r}; write "
                        f"predicates=[{name}]")
    try:
        found = tuple(declared)
    except TypeError:
        raise TypeError(f"{where}: predicates takes a list of predicates, not "
                        f"{declared!r}") from None
    for predicate in found:
        if predicate is any_of:
            raise TypeError(f"{where}: any_of makes a predicate of others; call it - "
                            f"any_of(generation_changed, labels_changed)")
        if not callable(predicate):
            raise TypeError(f"{where}: {predicate!r} is not a predicate: a predicate is a "
                            f"function (old, new) -> bool, such as "
                            f"predicates.generation_changed")
        try:
            signature = inspect.signature(predicate)
        except (TypeError, ValueError):  # a builtin without one: its call will tell
            continue
        try:
            signature.bind(None, None)
        except TypeError:
            raise TypeError(f"{where}: predicate {_name(predicate)}{signature} cannot be called "
                            f"as (old, new): a predicate takes the object before and after "
                            f"the change") from None
    return found


def passes(declared: Sequence[Predicate], old: Body | None, new: Body | None,
           where: str) -> bool:
    """Whether every predicate lets this change through (``where`` names the declaration in
    the log). One that raises, or returns ``None`` (no ``return``) or a function (a factory
    not called), counts as passing: logged as an error, the change goes on."""
    for predicate in declared:
        try:
            verdict = predicate(old, new)
        except Exception:
            log.exception("%s: predicate %s raised on %s; the change is let through", where,
                          _name(predicate), _path(new or old))
            continue
        if verdict is None or callable(verdict):
            log.error("%s: predicate %s returned %r on %s, not True or False; the change is "
                      "let through", where, _name(predicate), verdict, _path(new or old))
            continue
        if not verdict:
            return False
    return True


def _name(predicate: Any) -> str:
    return getattr(predicate, "__name__", None) or repr(predicate)


def _path(obj: Body | None) -> str:
    meta = _meta(obj)
    return "/".join(part for part in (meta.get("namespace"), meta.get("name")) if part) or "?"

"""Event filters applied by the watcher before a key is enqueued.

A predicate is ``(old, new) -> bool`` over API bodies; ``old`` is the cached object (``None`` for
an object not seen before) and ``new`` the one in the event (``None`` on deletion). Every
predicate of a reconciler must pass. Additions and deletions always pass: filters are for
updates, where most of the noise is (status writes, resyncs).
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional

Body = Mapping
Predicate = Callable[[Optional[Body], Optional[Body]], bool]


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

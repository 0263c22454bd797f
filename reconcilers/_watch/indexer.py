"""The index sets of one stream: each object filed under the values of the ``Index``
declarations of the reconcilers on it (what ``ctx.list(index=...)`` reads), in the cache
transaction that writes the object.

The rules: an index function that raises files the object under nothing, logged - a
malformed object never stops the stream; after a list every index set of the stream's scope
is rebuilt, not patched - a new watcher may have other index functions, and a relist after
Redis lost the cache finds the sets gone while the objects look unchanged.
"""

from __future__ import annotations

import logging
from typing import Mapping

from reconcilers._kube import cache
from reconcilers._base.vocab import GVR, Index

log = logging.getLogger(__name__)


class Indexer:
    """Files the objects of ``gvr`` in ``namespace`` (None: all) under ``indexes``, by name,
    through the pipeline each write goes in."""

    def __init__(self, gvr: GVR, namespace: str | None, indexes: Mapping[str, Index]):
        self.gvr, self.namespace = gvr, namespace
        self.indexes = indexes

    def values(self, obj: dict | None) -> dict[str, set[str]]:
        """Each index's values for ``obj``. An index function that raises files the object
        under nothing (logged): a malformed object never stops the stream."""
        out = {}
        for name, index in self.indexes.items():
            try:
                out[name] = index.values(obj)
            except Exception:
                log.exception("%s: index %r failed on %s", self.gvr.id, name,
                              ((obj or {}).get("metadata") or {}).get("name"))
                out[name] = set()
        return out

    def refile(self, path: str, old: dict | None, new: dict | None, pipe) -> None:
        """Move the object at ``path`` from ``old``'s index entries to ``new``'s (None: it
        was not there, or is gone)."""
        if self.indexes:
            cache.reindex(self.gvr, self.namespace, path, self.values(old), self.values(new),
                          pipe)

    def rebuild(self, seen: dict, pipe) -> None:
        """Every index set of this scope made again from ``seen`` (path -> object), after a
        list or on a resume."""
        cache.reset_indexes(self.gvr, self.namespace, self.indexes, pipe)
        for path, obj in seen.items():
            self.refile(path, None, obj, pipe)

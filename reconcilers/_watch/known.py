"""What one stream last saw of each object: the ``old`` of its next event, and what a relist
diffs against - client-go's store behind a Reflector, kept in the watcher's memory.

After a list it holds every object. After a resume it starts empty and reads through to the
shared cache, one object at a time as events arrive, and loads the rest only off the
restart's path (``COMPLETE_AFTER``) or when a relist needs them: a restart costs nothing per
unchanged object. The rule: only the reflector's thread changes it; ``len`` may be read from
any (the cache-size gauge reads it).
"""

from __future__ import annotations

import time

from reconcilers._kube import cache
from reconcilers._base.vocab import GVR, split_object_path

# Seconds after a resume before the reflector loads the cached objects no event brought.
COMPLETE_AFTER = 1.0


class Known:
    """The last state this stream saw of each object (sanitised, like the cache): the ``old``
    of the next event, and what a relist diffs against.

    After a list it holds every object. After a resume (of a stream without index sets, which
    rebuilds them from every object) it starts empty and reads through to the shared cache -
    an object's first event fetches what the predecessor cached (one HGET) - so a restart
    costs nothing per unchanged object before its watch runs, where decoding them all grows
    with the cache. The rest is loaded
    at the first event or bookmark ``COMPLETE_AFTER`` seconds on (``complete_if_due``), or
    at once when a relist needs them to diff against. Until then it depends on the cache: if
    Redis lost it in that window, an object no event brought has no ``old`` and a relist
    cannot report it vanished. Only the reflector's thread changes it; ``len`` may be read
    from any."""

    def __init__(self, gvr: GVR, namespace: str | None, objects: dict[str, dict],
                 complete: bool = True, size: int | None = None):
        self.gvr, self.namespace = gvr, namespace
        self._objects = objects
        self._complete = complete
        self._size = len(objects) if size is None else size
        self._due = time.monotonic() + COMPLETE_AFTER

    @classmethod
    def reading_through(cls, gvr: GVR, namespace: str | None) -> "Known":
        return cls(gvr, namespace, {}, complete=False, size=cache.count(gvr, namespace))

    @property
    def complete(self) -> bool:
        return self._complete

    def complete_if_due(self) -> None:
        """Load what no event brought, once the resumed watch has run ``COMPLETE_AFTER``
        seconds: off the restart's path, and from then on in memory as after a list."""
        if not self._complete and time.monotonic() >= self._due:
            self.all()

    def get(self, path: str) -> dict | None:
        obj = self._objects.get(path)
        if obj is None and not self._complete:
            ns, name = split_object_path(path)
            obj = cache.get(self.gvr, ns or None, name)
            if obj is not None:
                self._objects[path] = obj
        return obj

    def put(self, path: str, obj: dict, existed: bool) -> None:
        self._objects[path] = obj
        self._size += not existed

    def remove(self, path: str, existed: bool) -> None:
        self._objects.pop(path, None)
        self._size -= existed

    def all(self) -> dict[str, dict]:
        """Every object, loading from the cache what no event brought yet."""
        if not self._complete:
            loaded = cache.objects(self.gvr, self.namespace)
            loaded.update(self._objects)
            self._objects, self._complete = loaded, True
            self._size = len(loaded)
        return self._objects

    def __contains__(self, path: str) -> bool:
        return self.get(path) is not None

    def __iter__(self):
        return iter(self.all())

    def __len__(self) -> int:
        return self._size

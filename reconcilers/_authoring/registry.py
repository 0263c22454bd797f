"""Which reconcilers exist: ``@register`` puts a class here; autodiscovery imports user modules.

Like ``admin.site``: a default registry that ``AppConfig.ready()`` fills by importing every
installed app's ``reconcilers`` module, and an injectable ``ReconcilerRegistry`` for tests.
"""

from __future__ import annotations

import threading
from typing import Iterator, TypeVar

from django.utils.module_loading import autodiscover_modules

from reconcilers._authoring.reconciler import Reconciler

R = TypeVar("R", bound=type[Reconciler])


class AlreadyRegistered(Exception):
    """Two classes under one reconciler name, or holding objects with one finalizer."""


class NotRegistered(KeyError):
    pass


class ReconcilerRegistry:
    """Registered reconciler classes by name, and one instance of each."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Reconciler]] = {}
        self._instances: dict[str, Reconciler] = {}
        self._lock = threading.Lock()

    def register(self, cls: R) -> R:
        """Add ``cls`` under its ``name()``. Any number of reconcilers may share a kind, each
        under a name of its own; a second class under a taken name, or with the finalizer of
        another reconciler of its kind, is refused naming both (the same class again - a
        module imported twice - replaces)."""
        name = cls.name()
        cls.primary()  # validate the declaration now, not at the first event
        existing = self._classes.get(name)
        if existing is not None and not _same(existing, cls):
            fix = ("two reconcilers of one kind need a name each - set name = \"...\" on one "
                   "of them" if name == cls.resource_name() else "rename one of them")
            raise AlreadyRegistered(
                f"{_path(cls)} and {_path(existing)} are both named {name!r}: {fix}")
        # One finalizer on two kinds is harmless (no object carries both); on one kind, the
        # first reconciler's cleanup would release the object the second still holds.
        finalizer, kind = cls.finalizer_name(), cls.resource_name()
        for other_name, other in self._classes.items():
            if (finalizer and other_name != name and not _same(other, cls)
                    and other.resource_name() == kind and other.finalizer_name() == finalizer):
                raise AlreadyRegistered(
                    f"{_path(cls)} and {_path(other)} both use the finalizer {finalizer!r}: "
                    f"one's cleanup would release the object the other still holds - give "
                    f"one of them another finalizer (or leave finalizer unset for its own)")
        self._classes[name] = cls
        self._instances.pop(name, None)
        return cls

    def unregister(self, name: str) -> None:
        self._classes.pop(name, None)
        self._instances.pop(name, None)

    def get(self, name: str) -> Reconciler:
        """The (single, per process) instance of the reconciler named ``name``."""
        with self._lock:
            inst = self._instances.get(name)
            if inst is None:
                try:
                    inst = self._instances[name] = self._classes[name]()
                except KeyError:
                    raise NotRegistered(name) from None
            return inst

    def get_class(self, name: str) -> type[Reconciler]:
        try:
            return self._classes[name]
        except KeyError:
            raise NotRegistered(name) from None

    def names(self) -> list[str]:
        return sorted(self._classes)

    def __contains__(self, name: str) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[type[Reconciler]]:
        return iter([self._classes[n] for n in self.names()])

    def __len__(self) -> int:
        return len(self._classes)


def _same(a: type[Reconciler], b: type[Reconciler]) -> bool:
    return a is b or (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def _path(cls: type[Reconciler]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# The default registry, as Django's ``admin.site``: ``@register`` fills it while the app's
# ``ready()`` imports authors' modules (``autodiscover``, one thread, at start-up), and every
# thread reads it after. Module level so a decorator needs no argument; tests pass their own.
registry = ReconcilerRegistry()


def register(cls: R | None = None, *, registry: ReconcilerRegistry | None = None):
    """Class decorator: ``@register`` or ``@register(registry=my_registry)``; returns the class."""
    target = registry if registry is not None else globals()["registry"]

    def wrap(c: R) -> R:
        return target.register(c)

    return wrap(cls) if cls is not None else wrap


def autodiscover() -> None:
    autodiscover_modules("reconcilers", register_to=None)

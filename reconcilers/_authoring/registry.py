"""Which reconcilers exist: ``@register`` puts a class here; autodiscovery imports user modules.

Like ``admin.site``: a default registry that ``AppConfig.ready()`` fills by importing every
installed app's ``reconcilers`` module, and an injectable ``Registry`` for tests.
"""

from __future__ import annotations

import threading
from typing import Iterator, TypeVar

from django.utils.module_loading import autodiscover_modules

from reconcilers._authoring.reconciler import Reconciler

R = TypeVar("R", bound=type[Reconciler])


class AlreadyRegistered(Exception):
    pass


class NotRegistered(KeyError):
    pass


class Registry:
    def __init__(self) -> None:
        self._classes: dict[str, type[Reconciler]] = {}
        self._instances: dict[str, Reconciler] = {}
        self._lock = threading.Lock()

    def register(self, cls: R) -> R:
        name = cls.name()
        cls.primary()  # validate the declaration now, not at the first event
        existing = self._classes.get(name)
        if existing is not None and existing is not cls:
            if (existing.__module__, existing.__qualname__) != (cls.__module__, cls.__qualname__):
                raise AlreadyRegistered(f"{name} is already registered by {existing.__qualname__}")
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


registry = Registry()


def register(cls: R | None = None, *, registry: Registry | None = None):
    """Class decorator: ``@register`` or ``@register(registry=my_registry)``; returns the class."""
    target = registry if registry is not None else globals()["registry"]

    def wrap(c: R) -> R:
        return target.register(c)

    return wrap(cls) if cls is not None else wrap


def autodiscover() -> None:
    autodiscover_modules("reconcilers", register_to=None)

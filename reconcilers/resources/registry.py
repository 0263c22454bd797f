"""Where declared resources are found: a registry keyed by CRD name, and autodiscovery.

A ``Resource`` subclass registers itself on definition into ``Meta.registry`` (by default
``default_registry``). Tests inject their own ``KindRegistry()`` through ``Meta.registry`` or
``clear()`` one, so a test's declarations never leak into another's.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Iterable, Iterator

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from django.apps import AppConfig


# A ``Resource`` subclass. Named by alias, not imported: ``base`` imports this module.
ResourceClass = type

__all__ = ["KindRegistry", "default_registry", "autodiscover", "app_of"]


class KindRegistry:
    """Declared resources by ``<plural>.<group>``, iterated in name order (stable output)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, ResourceClass] = {}

    def register(self, resource: ResourceClass) -> ResourceClass:
        """Add ``resource``; a re-definition of the same class (a module reload) replaces it,
        a different class claiming the same CRD name is an error."""
        name = resource._meta.crd_name
        with self._lock:
            existing = self._by_name.get(name)
            if existing is not None and _origin(existing) != _origin(resource):
                raise ImproperlyConfigured(f"{name} is declared twice: by {_origin(existing)} "
                                           f"and by {_origin(resource)}")
            self._by_name[name] = resource
        return resource

    def unregister(self, resource: ResourceClass) -> None:
        with self._lock:
            if self._by_name.get(resource._meta.crd_name) is resource:
                del self._by_name[resource._meta.crd_name]

    def get(self, name: str) -> ResourceClass:
        """The resource declaring CRD ``name`` (``foos.samplecontroller.k8s.io``)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise LookupError(f"no resource declares {name!r}") from None

    def clear(self) -> None:
        with self._lock:
            self._by_name.clear()

    def for_apps(self, app_labels: Iterable[str] = ()) -> list[ResourceClass]:
        """Resources declared inside installed apps, only those of ``app_labels`` if given.

        Raises ``LookupError`` for a label that is not an installed app."""
        from django.apps import apps

        wanted = {apps.get_app_config(label) for label in app_labels}
        return [r for r in self if app_of(r) is not None and (not wanted or app_of(r) in wanted)]

    def __iter__(self) -> Iterator[ResourceClass]:
        with self._lock:
            return iter([self._by_name[name] for name in sorted(self._by_name)])

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str):
            return item in self._by_name
        return any(r is item for r in self._by_name.values())


def _origin(resource: type) -> str:
    return f"{resource.__module__}.{resource.__qualname__}"


def app_of(resource: ResourceClass) -> AppConfig | None:
    """The installed app whose package declares ``resource`` (its manifests go there)."""
    from django.apps import apps

    return apps.get_containing_app_config(resource.__module__)


def autodiscover() -> None:
    """Import every installed app's ``resources`` module, registering what it declares.

    Safe to call more than once (modules are imported once); call it from
    ``AppConfig.ready()`` or before reading ``default_registry`` outside a running app."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("resources")


# The default registry, as Django's ``admin.site``: filled while ``autodiscover`` imports the
# apps' ``resources`` modules (the app's ``ready()``, one thread, at start-up), read by every
# thread after. Module level so a class needs no argument to register; tests pass their own.
default_registry = KindRegistry()

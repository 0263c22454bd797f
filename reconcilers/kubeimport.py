"""The official Kubernetes client, imported without its generated classes until they are used.

``import kubernetes`` runs ``kubernetes/__init__`` and ``kubernetes/client/__init__``, which
import every generated API and model class: some 800 modules, a fifth of a second and tens of
MiB in every watcher and worker process, paid before a restarted watcher can list anything.
The framework speaks JSON and needs only the client's configuration, REST transport and config
loaders. So ``kubernetes``, ``kubernetes.client`` and ``kubernetes.client.models`` are
registered as *deferred packages*: their submodules import alone, and the first use of a name
their ``__init__`` defines runs that ``__init__``. ``from kubernetes import client;
client.CoreV1Api(...)`` in a reconciler works as it always does; it pays for the classes then.

If anything imported ``kubernetes`` before this module, nothing is deferred.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types

DEFERRED = ("kubernetes", "kubernetes.client", "kubernetes.client.models")

_lock = threading.RLock()


class DeferredPackage(types.ModuleType):
    """A package whose ``__init__`` has not run yet. A missing attribute is a submodule
    (imported alone) or a name the ``__init__`` defines (which runs it, once)."""

    _completing = False

    def __getattr__(self, name: str):
        full = f"{self.__name__}.{name}"
        if full in sys.modules:
            return sys.modules[full]
        if importlib.util.find_spec(full) is not None:
            return importlib.import_module(full)
        with _lock:
            if type(self) is DeferredPackage and not self._completing:
                self._completing = True
                try:
                    self.__spec__.loader.exec_module(self)
                finally:
                    del self._completing
                self.__class__ = types.ModuleType
        try:
            return self.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}") from None


def _defer(name: str) -> None:
    spec = importlib.util.find_spec(name)
    module = DeferredPackage(name)
    module.__spec__, module.__loader__ = spec, spec.loader
    module.__file__, module.__path__ = spec.origin, list(spec.submodule_search_locations)
    module.__package__ = name
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def defer_generated_classes() -> None:
    """Register the deferred packages, then import what the framework uses: the configuration,
    the REST client and API client, and the config loaders (which import ``ApiClient`` and
    ``Configuration`` from ``kubernetes.client``, so those two are set on it first)."""
    with _lock:
        if "kubernetes" in sys.modules:
            return
        for name in DEFERRED:
            _defer(name)
        from kubernetes.client import api_client, configuration

        client = sys.modules["kubernetes.client"]
        client.ApiClient = api_client.ApiClient
        client.Configuration = configuration.Configuration
        importlib.import_module("kubernetes.config")


def is_deferred(name: str) -> bool:
    """Whether ``name``'s ``__init__`` has not run yet (tests and diagnostics)."""
    return isinstance(sys.modules.get(name), DeferredPackage)

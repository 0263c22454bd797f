"""The official Kubernetes client, imported without its generated classes until they are used.

``import kubernetes`` runs ``kubernetes/__init__`` and ``kubernetes/client/__init__``, which
import every generated API and model class: some 800 modules, a fifth of a second and tens of
MiB in every watcher and worker process, paid before a restarted watcher can list anything.
The framework speaks JSON and needs only the client's configuration, REST transport and config
loaders. So ``kubernetes``, ``kubernetes.client`` and ``kubernetes.client.models`` are
registered as *deferred packages*: their submodules import alone, and the first use of a name
their ``__init__`` defines runs that ``__init__``. ``from kubernetes import client;
client.CoreV1Api(...)`` in a reconciler works as it always does; it pays for the classes then.

The client's own modules also import libraries for one rare path each: ``requests`` (its
proxy-bypass check, used only when a proxy is configured) and ``oauthlib`` with
``requests_oauthlib`` (OIDC token refresh from a kubeconfig): some 130 modules and ~26 ms of every
start. They are imported behind stand-ins (``_Absent``) whose names import the real library on
first use, so those paths work as before.

If anything imported ``kubernetes`` before this module, nothing is deferred.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from contextlib import contextmanager
from typing import Any, Iterator

DEFERRED = ("kubernetes", "kubernetes.client", "kubernetes.client.models")
# What the client's modules import for a rare path, by module. Each stands in only while its
# module is imported: the config loaders may import ``requests`` itself (through google-auth or
# adal, where installed), and must then get the real one.
OPTIONAL = {"kubernetes.client.rest": ("requests.utils",),
            "kubernetes.config": ("oauthlib", "oauthlib.oauth2", "requests_oauthlib")}

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


class _Absent(types.ModuleType):
    """Stands in ``sys.modules`` for an optional library while a client module imports it: a
    name the import binds (``from requests.utils import x``, ``import oauthlib.oauth2``) is a
    ``LazyName`` that imports the real library when first used."""

    def __getattr__(self, name: str) -> "LazyName":
        if name.startswith("__"):
            raise AttributeError(name)
        return LazyName(self.__name__, name)


_UNRESOLVED = object()


class LazyName:
    """``module.name``, imported on first call or attribute access (a submodule if there is
    one by that name)."""

    __slots__ = ("_module", "_name", "_value")

    def __init__(self, module: str, name: str):
        self._module, self._name, self._value = module, name, _UNRESOLVED

    def _resolve(self) -> Any:
        if self._value is not _UNRESOLVED:
            return self._value
        full = f"{self._module}.{self._name}"
        try:
            value = importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name != full:
                raise
            value = getattr(importlib.import_module(self._module), self._name)
        self._value = value
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._resolve(), name)

    def __repr__(self) -> str:
        return f"<deferred {self._module}.{self._name}>"


@contextmanager
def _absent(names: tuple[str, ...]) -> Iterator[None]:
    """``names`` stand in as ``_Absent`` for the duration, unless already imported (then the
    client binds the real ones)."""
    placed = {name: _Absent(name) for name in names if name not in sys.modules}
    sys.modules.update(placed)
    try:
        yield
    finally:
        for name, standin in placed.items():
            if sys.modules.get(name) is standin:
                del sys.modules[name]


def defer_generated_classes() -> None:
    """Register the deferred packages, then import what the framework uses: the configuration,
    the REST client and API client, and the config loaders (which import ``ApiClient`` and
    ``Configuration`` from ``kubernetes.client``, so those two are set on it first)."""
    with _lock:
        if "kubernetes" in sys.modules:
            return
        for name in DEFERRED:
            _defer(name)
        with _absent(OPTIONAL["kubernetes.client.rest"]):
            importlib.import_module("kubernetes.client.rest")
        from kubernetes.client import api_client, configuration

        client = sys.modules["kubernetes.client"]
        client.ApiClient = api_client.ApiClient
        client.Configuration = configuration.Configuration
        with _absent(OPTIONAL["kubernetes.config"]):
            importlib.import_module("kubernetes.config")


def is_deferred(name: str) -> bool:
    """Whether ``name``'s ``__init__`` has not run yet (tests and diagnostics)."""
    return isinstance(sys.modules.get(name), DeferredPackage)

"""Reconcile on start: a new leader reconciles every object whose reconciler's code or settings
changed since the last leader finished its pass.

A restarted watcher resumes its streams from where the last one stopped, so nothing in the
cluster looks changed and, without this pass, a deployed fix would wait for the resync period
(or for ever, with resync off). controller-runtime reconciles every object at every start; here
the default (``RECONCILERS_RECONCILE_ON_START=changed``) does so only when it can matter - when
the reconciler's fingerprint differs from the one whose pass last completed - because a restart
that changed nothing would otherwise cost a reconcile of every object for nothing: changes made
in the cluster meanwhile reach the new leader anyway, as watch events or as the relist's diff.
``always`` gives controller-runtime's behaviour.

The fingerprint is a digest of what decides what a run of an object writes:

- the Python source of the app that defines the reconciler (its Django app directory,
  migrations and tests left out);
- the Python source of this whole framework (the ``reconcilers`` package; its migrations, the
  local stack's tooling and the sample apps left out), so an upgrade of the framework reaches
  every object it may have left wrong, wherever in the package its fix is;
- the values of the settings the reconciler's app names in its source (``settings.X``,
  ``getattr(settings, "X")``), as plain data, with credentials left out at any depth.

What is left out, on purpose: per-process settings (ports, bind addresses: a hot standby
differs from the leader in them), credentials (a rotated password changes no object), the
framework's own ``RECONCILERS_*``/``OPERATOR_*`` settings (they tune how keys are queued and
runs are bounded, not what a run writes; a run they failed is retried anyway), Django's and
other libraries' settings, and settings the app never names. A version string alone would miss
a change to a user's own app. Code the reconciler reaches outside its app (another installed
package, a module elsewhere in the project, an environment variable read directly) is not in it
either: ``RECONCILERS_RECONCILE_ON_START=always`` covers those.

The pass enqueues through the ledger, so a key already queued or running is merged, never run
twice at once, and it leaves out every key this leader's streams handed to the enqueuer (a relist
of a cold cache hands over everything), whether or not it has reached the ledger yet: a stream
reads synced only once its relist's keys are handed over, so each object runs once. The
fingerprint is stored only once every key is in the ledger, so a leader that dies mid-pass
leaves the next one to do it again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from django.apps import apps
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from reconcilers._kube import cache
from reconcilers._queue import workqueue
from reconcilers._base.conf import settings
from reconcilers.models import RegisteredReconciler
from reconcilers._base.reconcile import Key, Trigger
from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base.vocab import GVR, split_object_path

log = logging.getLogger(__name__)

MODES = ("changed", "always")
# Directories that hold no code a run executes: an app's migrations and tests.
_SKIPPED_DIRS = frozenset({"migrations", "tests", "__pycache__"})
# The framework is the whole package; the local stack's tooling runs no reconcile, and each
# sample app is fingerprinted as an app when one of its reconcilers is registered.
_FRAMEWORK = Path(__file__).resolve().parents[1]
_FRAMEWORK_SKIPPED = _SKIPPED_DIRS | {"devstack", "contrib"}
# Names of credentials, as a setting's name or a key anywhere inside its value.
_CREDENTIALS = re.compile(r"SECRET|PASSW|TOKEN|CREDENTIAL|API_?KEY|PRIVATE", re.IGNORECASE)
# The framework's own settings: queue tuning and per-process values, not what a run writes.
_FRAMEWORK_SETTINGS = ("RECONCILERS_", "OPERATOR_")
_NAME = re.compile(rb"\b[A-Z][A-Z0-9_]*[A-Z0-9]\b")
_USERINFO = re.compile(r"(?<=://)([^/@:]*):[^/@]*@")


class _Stream(Protocol):
    gvr: GVR
    namespace: str | None

    @property
    def synced(self) -> bool: ...


class _Handed(Protocol):
    """What the pass asks of the term's enqueuer (``enqueuer.Enqueuer``)."""

    def put_so_far(self) -> frozenset[Key]: ...

    def forget(self) -> None: ...


def mode() -> str:
    value = settings().reconcile_on_start.strip().lower()
    if value not in MODES:
        raise ImproperlyConfigured(
            f"RECONCILERS_RECONCILE_ON_START={value!r}: expected one of {', '.join(MODES)}")
    return value


def fingerprint(cls: type[Reconciler]) -> str:
    """The digest of what decides what ``cls`` does: its app's source, the framework's
    source and the settings its app names (see the module's docstring)."""
    app = _app_dir(cls)
    digest = hashlib.sha256()
    for part in (_source_digest(app, _SKIPPED_DIRS), _source_digest(_FRAMEWORK, _FRAMEWORK_SKIPPED),
                 _settings_digest(_named_settings(app))):
        digest.update(part.encode())
    return digest.hexdigest()


def _app_dir(cls: type[Reconciler]) -> Path:
    config = apps.get_containing_app_config(cls.__module__)
    if config is not None:
        return Path(config.path).resolve()
    import sys

    module = sys.modules.get(cls.__module__)
    return Path(getattr(module, "__file__", "") or ".").resolve().parent


def _sources(root: Path, skipped: frozenset[str]) -> list[Path]:
    return [path for path in sorted(root.rglob("*.py"))
            if not skipped & set(path.relative_to(root).parts[:-1])]


@lru_cache(maxsize=None)
def _source_digest(root: Path, skipped: frozenset[str] = _SKIPPED_DIRS) -> str:
    digest = hashlib.sha256()
    for path in _sources(root, skipped):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@lru_cache(maxsize=None)
def _named_settings(app: Path) -> frozenset[str]:
    """The settings the app's source names (an upper-case word that is a setting), less
    Django's own, the framework's own and credentials (see the module's docstring)."""
    from django.conf import global_settings

    words: set[str] = set()
    for path in _sources(app, _SKIPPED_DIRS):
        words.update(w.decode() for w in _NAME.findall(path.read_bytes()))
    return frozenset(
        name for name in words
        if hasattr(django_settings, name) and not hasattr(global_settings, name)
        and not name.startswith(_FRAMEWORK_SETTINGS) and not _CREDENTIALS.search(name))


def _settings_digest(names: frozenset[str]) -> str:
    plain = _plain_settings(names, lambda name: getattr(django_settings, name))
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()


def _plain_settings(names: Iterable[str], value_of: Callable[[str], Any]) -> dict[str, Any]:
    """``{name: value}`` of the settings ``names`` whose values are plain data, credentials
    left out (``value_of(name)`` reads one)."""
    plain = {}
    for name in sorted(names):
        value = _plain(value_of(name))
        if value is not None:
            plain[name] = value
    return plain


def _plain(value: Any) -> Any:
    """``value`` as JSON-able data with credentials left out (keys named like one dropped, a
    URL's password blanked), or None when it is not plain data (a function's or an object's
    text would differ between processes)."""
    if value is None or isinstance(value, (int, float, bool)):
        return value
    if isinstance(value, str):
        return _USERINFO.sub(r"\1@", value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return None if any(i is None and v is not None for i, v in zip(items, value)) else items
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if _CREDENTIALS.search(str(k)):
                continue
            item = _plain(v)
            if item is None and v is not None:
                return None
            out[str(k)] = item
        return out
    return None


class StartPass:
    """The pass a new leader owes: reconcilers whose fingerprint changed (or all of them, in
    ``always`` mode), each enqueued once every stream of its primary resource is synced, less
    the keys the term's streams handed to ``handed`` already."""

    def __init__(self, reconcilers: Iterable[type[Reconciler]], handed: _Handed):
        self.always = mode() == "always"
        self.fingerprints = {cls.name(): (cls, fingerprint(cls)) for cls in reconcilers}
        self.handed = handed
        self.pending: dict[str, tuple[type[Reconciler], str]] | None = None  # read at 1st call
        self.enqueued = 0

    def __call__(self, streams: list[_Stream]) -> None:
        """Enqueue every reconciler now due (its primary streams all synced); a failure (the
        database down) is retried at the next call."""
        try:
            self._due(streams)
        except Exception as exc:
            log.warning("start pass: %s; retrying", exc)

    def _due(self, streams: list[_Stream]) -> None:
        if self.pending is None:
            done = dict(RegisteredReconciler.objects.values_list("name", "start_fingerprint"))
            self.pending = {name: (cls, fp) for name, (cls, fp) in self.fingerprints.items()
                            if self.always or done.get(name) != fp}
            for name in sorted(self.fingerprints.keys() - self.pending.keys()):
                log.info("start pass: none for %s (its code and settings are those of the "
                         "last leader's pass)", name)
        for name, (cls, fp) in list(self.pending.items()):
            primary = [s for s in streams if s.gvr == cls.primary()]
            if not primary or not all(s.synced for s in primary):
                continue
            handed = self.handed.put_so_far()
            keys = [k for k in _cached_keys(name, primary) if k not in handed]
            workqueue.add(keys, Trigger.START)
            RegisteredReconciler.objects.filter(name=name).update(start_fingerprint=fp)
            del self.pending[name]
            self.enqueued += len(keys)
            log.info("start pass: %d objects of %s enqueued (its code or settings changed "
                     "since the last leader's pass, or RECONCILERS_RECONCILE_ON_START=always)",
                     len(keys), name)
        if self.done:
            self.handed.forget()

    @property
    def done(self) -> bool:
        return self.pending == {}


def _cached_keys(reconciler: str, streams: list[_Stream]) -> list[Key]:
    gvr = streams[0].gvr
    scopes = {s.namespace for s in streams}
    keys = []
    for path in sorted(cache.fields(gvr)):
        namespace, name = split_object_path(path)
        if None in scopes or namespace in scopes:
            keys.append(Key(reconciler, namespace, name))
    return keys

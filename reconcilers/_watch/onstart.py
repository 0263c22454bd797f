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

The fingerprint is a digest of the Python source of the app that defines the reconciler (its
Django app directory, migrations and tests left out), of this framework's own source, and of
every Django setting whose value is plain data (strings, numbers, lists, dicts...). A version
string alone would miss a change to a user's own app. Code the reconciler reaches outside
those (another installed package, an environment variable read directly) is not in it.

The pass enqueues through the ledger, so a key already queued or running is merged, never run
twice at once, and it leaves out keys this leader's streams already enqueued (a relist of a
cold cache enqueues everything): each object runs once. The fingerprint is stored only once
every key is in the ledger, so a leader that dies mid-pass leaves the next one to do it again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Protocol

from django.apps import apps
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from reconcilers._kube import cache
from reconcilers._queue import workqueue
from reconcilers._base.conf import settings
from reconcilers.models import RegisteredReconciler, Trigger, WorkItem
from reconcilers._authoring.reconciler import Reconciler
from reconcilers._base.vocab import GVR, Key, split_object_path

log = logging.getLogger(__name__)

MODES = ("changed", "always")
_SKIPPED_DIRS = {"migrations", "tests", "__pycache__"}
_FRAMEWORK = Path(__file__).resolve().parent
_CREDENTIALS = re.compile(r"SECRET|PASSWORD|TOKEN|_URLS?$")


class _Stream(Protocol):
    gvr: GVR
    namespace: str | None

    @property
    def synced(self) -> bool: ...


def mode() -> str:
    value = settings().reconcile_on_start.strip().lower()
    if value not in MODES:
        raise ImproperlyConfigured(
            f"RECONCILERS_RECONCILE_ON_START={value!r}: expected one of {', '.join(MODES)}")
    return value


def fingerprint(cls: type[Reconciler]) -> str:
    """The digest of what decides what ``cls`` does: its app's source, the framework's
    source and the settings (see the module's docstring)."""
    digest = hashlib.sha256()
    for part in (_source_digest(_app_dir(cls)), _source_digest(_FRAMEWORK), _settings_digest()):
        digest.update(part.encode())
    return digest.hexdigest()


def _app_dir(cls: type[Reconciler]) -> Path:
    config = apps.get_containing_app_config(cls.__module__)
    if config is not None:
        return Path(config.path).resolve()
    import sys

    module = sys.modules.get(cls.__module__)
    return Path(getattr(module, "__file__", "") or ".").resolve().parent


@lru_cache(maxsize=None)
def _source_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if _SKIPPED_DIRS & set(relative.parts[:-1]):
            continue
        digest.update(str(relative).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _settings_digest() -> str:
    from django.conf import global_settings

    plain = {}
    for name in sorted(dir(django_settings)):
        if (name.isupper() and not hasattr(global_settings, name)
                and name != "SETTINGS_MODULE" and not _CREDENTIALS.search(name)):
            value = _plain(getattr(django_settings, name))
            if value is not None:
                plain[name] = value
    # The operator's own settings, wherever they are set (the environment, most often).
    plain.update((name, _plain(value)) for name, value, _, _ in settings().table())
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()


def _plain(value: Any) -> Any:
    """``value`` as JSON-able data, or None when it is not plain data (a function's or an
    object's text would differ between processes)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return None if any(i is None and v is not None for i, v in zip(items, value)) else items
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            item = _plain(v)
            if item is None and v is not None:
                return None
            out[str(k)] = item
        return out
    return None


class StartPass:
    """The pass a new leader owes: reconcilers whose fingerprint changed (or all of them, in
    ``always`` mode), each enqueued once every stream of its primary resource is synced."""

    def __init__(self, reconcilers: Iterable[type[Reconciler]]):
        self.always = mode() == "always"
        self.fingerprints = {cls.name(): (cls, fingerprint(cls)) for cls in reconcilers}
        self.pending: dict[str, tuple[type[Reconciler], str]] | None = None  # read at 1st call
        self.began: Any = None  # the database's clock when this leader's pass began
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
            with connection.cursor() as cursor:  # the clock enqueued_at is written by
                cursor.execute("SELECT now()")
                self.began = cursor.fetchone()[0]
            done = dict(RegisteredReconciler.objects.values_list("name", "start_fingerprint"))
            self.pending = {name: (cls, fp) for name, (cls, fp) in self.fingerprints.items()
                            if self.always or done.get(name) != fp}
        for name, (cls, fp) in list(self.pending.items()):
            primary = [s for s in streams if s.gvr == cls.primary()]
            if not primary or not all(s.synced for s in primary):
                continue
            already = set(WorkItem.objects.filter(reconciler=name, enqueued_at__gte=self.began)
                          .values_list("namespace", "name"))
            keys = [k for k in _cached_keys(name, primary)
                    if (k.namespace, k.name) not in already]
            workqueue.add(keys, Trigger.START)
            RegisteredReconciler.objects.filter(name=name).update(start_fingerprint=fp)
            del self.pending[name]
            self.enqueued += len(keys)
            log.info("start pass: %d objects of %s enqueued (its code or settings changed "
                     "since the last leader's pass, or RECONCILERS_RECONCILE_ON_START=always)",
                     len(keys), name)

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

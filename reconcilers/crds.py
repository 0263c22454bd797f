"""Installing the CRDs that registered reconcilers need, when the watcher starts.

A reconciler's CRD manifest is ``<app>/crds/<plural>.<group>.yaml`` in the app that defines
it (``manage.py makecrds`` writes it). The watcher server-side-applies it when
``RECONCILERS_APPLY_CRDS`` is on, and always for the bundled samples when ``OPERATOR_SAMPLES=1``. Production clusters usually install CRDs
through their own pipeline, so this is off by default there.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterable, TextIO

import yaml
from django.apps import apps
from django.conf import settings as django_settings

from . import kube
from .conf import settings
from .resources.apply import apply_crds
from .spec import Reconciler


def manifest_for(cls: type[Reconciler]) -> Path | None:
    app = apps.get_containing_app_config(cls.__module__)
    if app is None:
        return None
    path = Path(app.path) / "crds" / f"{cls.name()}.yaml"
    return path if path.exists() else None


def is_sample(cls: type[Reconciler]) -> bool:
    return cls.__module__.startswith("reconcilers.contrib.")


def apply_manifest(api, path: Path, timeout: float = 60) -> str:
    """Server-side apply one CRD manifest and wait until it is Established."""
    ((_, outcome),) = apply_crds([yaml.safe_load(path.read_text())], api, timeout=timeout)
    return outcome


def sync_registered(classes: Iterable[type[Reconciler]], out: TextIO = sys.stdout) -> None:
    """Apply the manifests of ``classes`` the settings allow (idempotent: server-side apply)."""
    apply_all = settings().apply_crds
    samples = getattr(django_settings, "OPERATOR_SAMPLES", False)
    api = kube.api_client()
    for cls in classes:
        path = manifest_for(cls)
        if path is not None and (apply_all or (samples and is_sample(cls))):
            out.write(f"CRD {cls.name()}: {apply_manifest(api, path)}\n")

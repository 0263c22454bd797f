"""CRD manifest files: one ``<plural>.<group>.yaml`` per resource in its app's ``crds/``.

The logic behind ``makecrds``: plan what each file should contain, say which are missing or
stale (``--check``, like ``makemigrations --check``), write the ones that differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from django.core.exceptions import ImproperlyConfigured

from .base import Resource
from .crd import render
from .registry import app_of

__all__ = ["Manifest", "manifest_path", "plan_manifests", "write_manifests"]

CURRENT, MISSING, STALE = "current", "missing", "stale"


@dataclass(frozen=True)
class Manifest:
    resource: type[Resource] | None  # None: the webhook server's manifests, for every resource
    path: Path
    content: str

    @property
    def state(self) -> str:
        """``current``, ``missing`` or ``stale`` (the file differs from the declaration)."""
        if not self.path.is_file():
            return MISSING
        return CURRENT if self.path.read_text(encoding="utf-8") == self.content else STALE


def manifest_path(resource: type[Resource], directory: Path | None = None) -> Path:
    """Where ``resource``'s manifest lives: ``directory`` or ``<app dir>/crds/``."""
    if directory is None:
        app = app_of(resource)
        if app is None:
            raise ImproperlyConfigured(
                f"{resource.__module__}.{resource.__qualname__} is not declared inside an "
                "installed app; put it in an app's resources.py or pass a directory")
        directory = Path(app.path) / "crds"
    return Path(directory) / f"{resource._meta.crd_name}.yaml"


def plan_manifests(resources: Iterable[type[Resource]],
                   directory: Path | None = None) -> list[Manifest]:
    return [Manifest(r, manifest_path(r, directory), render(r)) for r in resources]


def write_manifests(manifests: Iterable[Manifest]) -> list[Manifest]:
    """Write the manifests whose file is missing or stale; return those written."""
    written = []
    for manifest in manifests:
        if manifest.state == CURRENT:
            continue
        manifest.path.parent.mkdir(parents=True, exist_ok=True)
        manifest.path.write_text(manifest.content, encoding="utf-8")
        written.append(manifest)
    return written

"""Checks on object references typed by people (commands, admin forms) before they are enqueued."""

from __future__ import annotations

import re

from reconcilers._authoring.reconciler import Reconciler

# Kubernetes names: DNS-1123 subdomain (most kinds) - lowercase alphanumerics, '-' and '.'.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_object_ref(cls: type[Reconciler], namespace: str | None, name: str | None) -> None:
    """Raise ``ValueError`` with a message a person can act on."""
    namespaced = cls.primary().namespaced
    if namespace is not None and namespace != "":
        if not namespaced:
            raise ValueError(f"{cls.name()} is cluster-scoped: give no namespace")
        if len(namespace) > 63 or not _NAMESPACE.match(namespace):
            raise ValueError(f"{namespace!r} is not a valid namespace name (DNS-1123 label)")
    if name is not None:
        if len(name) > 253 or not _NAME.match(name):
            raise ValueError(f"{name!r} is not a valid object name (DNS-1123 subdomain)")
        if namespaced and not namespace:
            raise ValueError(f"{cls.name()} is namespaced: give the object's namespace")

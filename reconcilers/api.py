"""The public API for reconciler authors: import everything from here.

    from reconcilers.api import Reconciler, register, Owns, Result, PermanentError

Nothing else in the package is meant for user code: Celery, the ledger and the Kubernetes
plumbing stay behind this surface.
"""

from . import events, predicates
from .context import Context, NotOwnedError
from .registry import Registry, register
from .results import PermanentError, Result, TemporaryError
from .spec import GVR, Owns, Reconciler

__all__ = [
    "Context",
    "GVR",
    "NotOwnedError",
    "Owns",
    "PermanentError",
    "Reconciler",
    "Registry",
    "Result",
    "TemporaryError",
    "events",
    "predicates",
    "register",
]

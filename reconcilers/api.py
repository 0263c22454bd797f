"""The public API for reconciler authors: import everything from here.

    from reconcilers.api import Reconciler, register, Owns, Result, PermanentError

Nothing else in the package is meant for user code: Celery, the ledger and the Kubernetes
plumbing stay behind this surface.
"""

from . import events, predicates
from .admission import ValidationError, Webhook
from .context import Context, Lister, NotOwnedError, controller_of
from .kube import ApiError
from .registry import Registry, register
from .results import PermanentError, Result, TemporaryError
from .spec import Reconciler
from .vocab import GVR, Index, Key, Owns, Watches

__all__ = [
    "ApiError",
    "Context",
    "GVR",
    "Index",
    "Key",
    "Lister",
    "NotOwnedError",
    "Owns",
    "PermanentError",
    "Reconciler",
    "Registry",
    "Result",
    "TemporaryError",
    "ValidationError",
    "Watches",
    "Webhook",
    "controller_of",
    "events",
    "predicates",
    "register",
]

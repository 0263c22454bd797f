"""The public API for reconciler authors: import everything from here.

    from reconcilers.api import Reconciler, register, Owns, Result, PermanentError

Nothing else in the package is meant for user code: Celery, the ledger and the Kubernetes
plumbing stay behind this surface.
"""

from . import events, predicates
from .admission import ValidationError, Webhook
from .context import Context, Lister, NotOwnedError, controller_of
from .dependents import Dependent, Progress, Workflow
from .kube import ApiError
from .registry import Registry, register
from .results import PermanentError, Result, TemporaryError
from .spec import Reconciler
from .timers import timer
from .vocab import GVR, Index, Key, Owns, Watches

__all__ = [
    "ApiError",
    "Context",
    "Dependent",
    "GVR",
    "Index",
    "Key",
    "Lister",
    "NotOwnedError",
    "Owns",
    "PermanentError",
    "Progress",
    "Reconciler",
    "Registry",
    "Result",
    "TemporaryError",
    "ValidationError",
    "Watches",
    "Webhook",
    "Workflow",
    "controller_of",
    "events",
    "predicates",
    "register",
    "timer",
]

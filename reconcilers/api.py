"""The public API for reconciler authors: import everything from here.

    from reconcilers.api import Reconciler, register, Owns, Result, PermanentError

Nothing else in the package is meant for user code: Celery, the ledger and the Kubernetes
plumbing stay behind this surface.
"""

from reconcilers._kube import events
from reconcilers._base import predicates, renamed
from reconcilers._webhooks.admission import ValidationError, Webhook
from reconcilers._kube.children import NotOwnedError, controller_of
from reconcilers._kube.context import Context
from reconcilers._kube.lister import Lister
from reconcilers._authoring.dependents import Dependent, Progress, Workflow
from reconcilers._kube.kube import ApiError
from reconcilers._authoring.registry import ReconcilerRegistry, register
from reconcilers._base.reconcile import Key, PermanentError, Result, TemporaryError
from reconcilers._authoring.reconciler import Reconciler
from reconcilers._run.timers import timer
from reconcilers._base.vocab import GVR, Index, Owns, Watches

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
    "ReconcilerRegistry",
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

# Old names still importable for one release, each with a warning naming its successor.
__getattr__ = renamed.lookup(__name__, globals(), {"Registry": "ReconcilerRegistry"})

"""The Django admin: where people find out why an object did or did not reconcile, and push it.

One module per page group: ``history`` (reconcile records), ``workitems`` (the ledger, actions,
per-object timeline), ``registered`` (reconcilers, capability levels, resync forms),
``streams`` (watch streams, audit log, capability levels), ``dashboard``. Admin code stays thin:
manual actions go through ``reconcilers._queue.manual``; nothing here calls the Kubernetes API.

The app registers its pages on the project's admin site and leaves the site itself alone: the
reconcilers' list links the dashboard and the resync form. A project that wants the operator
panel on its admin index sets ``admin.site.index_template = "reconcilers/admin/index.html"``
(as this repository's project does, in ``operator_project/urls.py``).
"""

from . import history, registered, streams, workitems  # noqa: F401 (registers)

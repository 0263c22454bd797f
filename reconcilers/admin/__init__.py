"""The Django admin: where people find out why an object did or did not reconcile, and push it.

One module per page group: ``history`` (reconcile records), ``workitems`` (the ledger, actions,
per-object timeline), ``registered`` (reconcilers, capability levels, resync forms),
``streams`` (watch streams, audit log, capability levels), ``dashboard``. Admin code stays thin:
manual actions go through ``reconcilers.manual``; nothing here calls the Kubernetes API.
"""

from django.contrib import admin

from . import history, registered, streams, workitems  # noqa: F401 (registers)

admin.site.index_template = "reconcilers/admin/index.html"
admin.site.site_header = "django-crd-operator"
admin.site.site_title = "Operator admin"

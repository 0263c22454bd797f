"""URLs: the admin at /admin/; liveness at /healthz, readiness at /readyz and Prometheus
metrics at /metrics (``reconcilers.urls``). A process started without the admin's apps
(``OPERATOR_SERVES_PAGES=0``: the watcher, the workers) has the health endpoints only."""

from django.conf import settings
from django.urls import include, path

urlpatterns = [path("", include("reconcilers.urls"))]

if settings.SERVES_PAGES:
    from django.contrib import admin

    # This project's admin: the operator panel on its index, and its name in the header.
    admin.site.index_template = "reconcilers/admin/index.html"
    admin.site.site_header = "django-crd-operator"
    admin.site.site_title = "Operator admin"
    urlpatterns.insert(0, path("admin/", admin.site.urls))

"""URLs: the admin at /admin/; liveness at /healthz, readiness at /readyz and Prometheus
metrics at /metrics (reconcilers/health.py)."""

from django.contrib import admin
from django.urls import path

from reconcilers import health

# This project's admin: the operator panel on its index, and its name in the header.
admin.site.index_template = "reconcilers/admin/index.html"
admin.site.site_header = "django-crd-operator"
admin.site.site_title = "Operator admin"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics_view, name="metrics"),
]

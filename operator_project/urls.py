"""URLs: the admin at /admin/; liveness at /healthz, readiness at /readyz and Prometheus
metrics at /metrics (reconcilers/health.py)."""

from django.contrib import admin
from django.urls import path

from reconcilers import health

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics_view, name="metrics"),
]

"""The app's own endpoints, for a project's ``urls.py``: ``path("", include("reconcilers.urls"))``
gives liveness at /healthz, readiness at /readyz and Prometheus metrics at /metrics."""

from django.urls import path

from reconcilers._web import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics_view, name="metrics"),
]

"""URLs: the admin at /admin/; liveness at /healthz and readiness at /readyz (reconcilers/health.py)."""

from django.contrib import admin
from django.urls import path

from reconcilers import health

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
]

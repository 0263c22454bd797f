"""The Celery app. Configuration comes from Django settings prefixed ``CELERY_``."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "operator_project.settings")

app = Celery("operator_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

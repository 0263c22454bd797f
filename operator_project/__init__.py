"""The Django project: settings, URLs, and the Celery app that every process runs.

The app is imported at start, as Celery's Django guide has it: the work queue publishes its
messages through it, so every process that sends - the watcher too - needs it. ``celery -A operator_project`` finds it in ``operator_project.celery``.
"""

from .celery import app as celery_app

__all__ = ("celery_app",)

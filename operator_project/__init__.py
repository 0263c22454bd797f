"""The Django project: settings, URLs, and the Celery app that workers and beat run."""

from .celery import app as celery_app

__all__ = ("celery_app",)

"""The Django project: settings, URLs, and the Celery app that workers and beat run.

The app is imported at start, as Celery's Django guide has it, by every process but the
watcher: it sends its messages without Celery (``reconcilers/broker.py``), and importing
Celery would only delay a restarted watcher's first key. ``celery -A operator_project`` finds
the app in ``operator_project.celery`` either way.
"""

import sys

if sys.argv[1:2] != ["watch"]:
    from .celery import app as celery_app

    __all__ = ("celery_app",)

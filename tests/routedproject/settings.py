"""The test settings, plus what a user's project adds: a Celery route for every reconcile task,
and an app whose ``before_task_publish`` handler counts the messages by queue."""

from tests.settings import *  # noqa: F401,F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.routedproject.apps.RoutedConfig"]
CELERY_TASK_ROUTES = {"reconcile:*": {"queue": "widgets"}}

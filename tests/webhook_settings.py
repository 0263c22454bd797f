"""``tests.settings`` plus ``tests.webhookapp``: a webhook server with a hook on Deployments."""

from tests.settings import *  # noqa: F401,F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.webhookapp"]

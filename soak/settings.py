"""The soak's operator: the project's settings plus the SoakItem app."""

from operator_project.settings import *  # noqa: F401,F403
from operator_project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "soak.soakapp"]

"""The soak's operator: the project's settings plus the SoakItem app."""

import os

from operator_project.settings import *  # noqa: F401,F403
from operator_project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "soak.soakapp"]

# What the SoakItem reconciler writes into status.note. The soak's rolling upgrade changes it:
# a setting is part of the reconciler's fingerprint, so the new leader's start pass must
# reconcile every object.
SOAK_NOTE = os.environ.get("SOAK_NOTE", "")

"""Test settings: the project's settings plus the test operator app (the ``Probe`` kind)."""

from operator_project.settings import *  # noqa: F401,F403
from operator_project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.operatorapp"]
# The test kinds have hooks too: never let `makecrds` here rewrite the project's file.
RECONCILERS_WEBHOOK_MANIFESTS = ""

import os  # noqa: E402

# A setting of the user's app that the Probe writes into its status (the start pass's test).
PROBE_NOTE = os.environ.get("PROBE_NOTE", "")

"""The test settings, plus a user's own app with a second reconciler of the sample's kind
(``tests/e2e/test_several_reconcilers.py``)."""

from tests.settings import *  # noqa: F401,F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.multiproject"]

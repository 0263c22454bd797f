"""The ready-to-run project as an app of its own, so it can carry data migrations.

Its migrations live in the repository's top-level ``migrations/`` (``MIGRATION_MODULES``);
the framework app's schema migrations live inside the app (``reconcilers/migrations``) and
travel with it into any project.
"""

from django.apps import AppConfig


class OperatorProjectConfig(AppConfig):
    name = "operator_project"
    label = "operator_project"
    verbose_name = "Operator project"

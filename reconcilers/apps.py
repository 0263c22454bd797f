"""App configuration: loads every installed app's ``reconcilers.py`` and wires the engine."""

import sys

from django.apps import AppConfig


class ReconcilersConfig(AppConfig):
    name = "reconcilers"
    verbose_name = "Reconcilers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Every process sends the work queue's messages through ``broker`` (the project's
        Celery app); the Celery tasks are registered where Celery is loaded."""
        from . import broker, checks, registry, resources  # noqa: F401 (checks registers)

        resources.autodiscover()
        registry.autodiscover()
        broker.install()
        if "celery" in sys.modules:
            from . import tasks

            tasks.install()

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
        from . import checks  # noqa: F401 (registers the system checks)
        from . import broker, metrics, registry, resources

        resources.autodiscover()
        registry.autodiscover()
        metrics.initialise(registry.registry.names())
        broker.install()
        if "celery" in sys.modules:
            from . import tasks

            tasks.install()

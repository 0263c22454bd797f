"""App configuration: loads every installed app's ``reconcilers.py`` and wires the engine."""

import sys

from django.apps import AppConfig


class ReconcilersConfig(AppConfig):
    name = "reconcilers"
    verbose_name = "Reconcilers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Every process sends the work queue's messages through ``broker`` (the project's
        Celery app); its metrics settle here (``metrics.initialise``), before a worker forks;
        the Celery tasks are registered where Celery is loaded. Importing the app's modules
        does none of this."""
        from reconcilers._queue import checks  # noqa: F401 (registers the system checks)
        from reconcilers._queue import broker
        from reconcilers._base import metrics
        from reconcilers._authoring import registry
        from reconcilers import resources

        resources.autodiscover()
        registry.autodiscover()
        metrics.initialise(registry.registry.names())
        broker.install()
        if "celery" in sys.modules:
            from reconcilers._run import tasks

            tasks.install()

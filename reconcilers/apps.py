"""App configuration: loads every installed app's ``reconcilers.py`` and wires the engine."""

import sys
from types import ModuleType

from django.apps import AppConfig


class ReconcilersConfig(AppConfig):
    name = "reconcilers"
    verbose_name = "Reconcilers"
    default_auto_field = "django.db.models.BigAutoField"

    def __init__(self, app_name: str, app_module: ModuleType | None) -> None:
        """Where this program's metrics live is settled as Django starts (``metrics.settle``),
        before any app's models, admin or ``ready()`` are imported - not in ``ready()``, which
        runs after the admin's: ``prometheus_client`` picks multiprocess files at its first
        import, and a project's own modules (its reconcilers, which the admin's or our
        ``ready()`` import) may import it to declare figures of their own. Before a worker
        forks, too, so its children share the directory."""
        super().__init__(app_name, app_module)
        from reconcilers._base import metrics

        metrics.settle()

    def ready(self) -> None:
        """Every process sends the work queue's messages through ``broker`` (the project's
        Celery app); the Celery tasks are registered where Celery is loaded. Importing the
        app's modules does none of this."""
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

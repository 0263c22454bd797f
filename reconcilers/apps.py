"""App configuration: loads every installed app's ``reconcilers.py`` and wires the engine."""

from django.apps import AppConfig


class ReconcilersConfig(AppConfig):
    name = "reconcilers"
    verbose_name = "Reconcilers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, registry, resources, tasks  # noqa: F401 (checks registers)

        resources.autodiscover()
        registry.autodiscover()
        tasks.install()

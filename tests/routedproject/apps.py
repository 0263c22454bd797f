from django.apps import AppConfig

PUBLISHED = "routed:published:"  # + the queue: how many reconcile messages went there


def count(sender: str | None = None, routing_key: str | None = None, **_) -> None:
    if sender and sender.startswith("reconcile:"):
        from reconcilers._kube.cache import get_redis

        get_redis().incr(f"{PUBLISHED}{routing_key}")


class RoutedConfig(AppConfig):
    name = "tests.routedproject"
    label = "routedproject"

    def ready(self) -> None:
        from celery import signals

        signals.before_task_publish.connect(count, weak=False)

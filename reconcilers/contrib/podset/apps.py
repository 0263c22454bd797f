from django.apps import AppConfig


class PodSetConfig(AppConfig):
    name = "reconcilers.contrib.podset"
    label = "podset"
    verbose_name = "Sample controller (PodSet)"

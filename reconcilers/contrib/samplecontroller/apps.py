from django.apps import AppConfig


class SampleControllerConfig(AppConfig):
    name = "reconcilers.contrib.samplecontroller"
    label = "samplecontroller"
    verbose_name = "Sample controller (Foo)"

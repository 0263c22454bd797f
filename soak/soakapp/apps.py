from django.apps import AppConfig


class SoakAppConfig(AppConfig):
    name = "soak.soakapp"
    label = "soakapp"

from django.apps import AppConfig


class SoakAppConfig(AppConfig):
    name = "soak.soakapp"
    label = "soakapp"

    def ready(self) -> None:
        from . import messages

        messages.connect()

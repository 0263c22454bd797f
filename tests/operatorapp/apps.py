from django.apps import AppConfig


class OperatorAppConfig(AppConfig):
    name = "tests.operatorapp"
    label = "operatorapp"

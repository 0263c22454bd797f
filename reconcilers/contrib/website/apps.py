from django.apps import AppConfig


class WebsiteConfig(AppConfig):
    name = "reconcilers.contrib.website"
    label = "website"
    verbose_name = "Sample controller (Website: dependent resources)"

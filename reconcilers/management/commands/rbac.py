"""``python manage.py rbac``: print the least-privilege ClusterRole (and binding) as YAML."""

from __future__ import annotations

import yaml
from django.core.management.base import BaseCommand

from reconcilers import rbac
from reconcilers.registry import registry


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser) -> None:
        parser.add_argument("--name", default="django-crd-operator")
        parser.add_argument("--service-account", default=None,
                            help="also print a ClusterRoleBinding to this ServiceAccount")
        parser.add_argument("--namespace", default="django-crd-operator",
                            help="the ServiceAccount's namespace")

    def handle(self, *args, name: str, service_account: str | None, namespace: str,
               **options) -> None:
        if not len(registry):
            self.stderr.write("no reconcilers are registered: only the framework's own rules "
                              "(Events, the watcher's Lease); add your app and run this again")
        docs = [rbac.cluster_role(list(registry), name)]
        if service_account:
            docs.append(rbac.cluster_role_binding(name, service_account, namespace))
        self.stdout.write(yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False))

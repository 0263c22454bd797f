"""``python manage.py rbac``: print the least-privilege RBAC (and bindings) as YAML.

A ClusterRole when the operator watches every namespace; with ``RECONCILERS_NAMESPACES`` (or
``--namespaces``) a Role per namespace, and a ClusterRole only for what is cluster-scoped.
"""

from __future__ import annotations

import yaml
from django.core.management.base import BaseCommand

from reconcilers._authoring import rbac
from reconcilers._base.conf import settings
from reconcilers._authoring.registry import registry


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser) -> None:
        parser.add_argument("--name", default="django-crd-operator")
        parser.add_argument("--service-account", default=None,
                            help="also print the bindings to this ServiceAccount")
        parser.add_argument("--namespace", default="django-crd-operator",
                            help="the ServiceAccount's namespace")
        parser.add_argument("--namespaces", default=None,
                            help="comma-separated namespaces the operator watches (default: "
                                 "RECONCILERS_NAMESPACES; empty = all, one ClusterRole)")

    def handle(self, *args, name: str, service_account: str | None, namespace: str,
               namespaces: str | None, **options) -> None:
        if not len(registry):
            self.stderr.write("no reconcilers are registered: only the framework's own rules "
                              "(Events, the watcher's Lease); add your app and run this again")
        watched = (settings().namespace_list if namespaces is None
                   else [n.strip() for n in namespaces.split(",") if n.strip()])
        lease = settings().lease_namespace
        if watched and service_account and lease != namespace:
            self.stderr.write(f"the Lease's Role is in namespace {lease!r} "
                              f"(RECONCILERS_LEASE_NAMESPACE), not {namespace!r}: run this with "
                              f"the operator's settings")
        docs = rbac.manifests(list(registry), name, service_account, namespace, watched)
        self.stdout.write(yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False))

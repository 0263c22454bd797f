"""Write the CRD manifests of declared resources to each app's ``crds/`` directory.

``--check`` writes nothing and fails when a manifest is missing or stale, like
``makemigrations --check``: run it in CI so a changed resource class cannot ship without its CRD.
With ``RECONCILERS_WEBHOOK_MANIFESTS`` set (this project: ``deploy/webhook/generated.yaml``) the
webhook server's cluster manifests - its read-only ClusterRole and the two configurations, which
change with the resources' hooks - are kept and checked the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from reconcilers._webhooks import registration
from reconcilers._base.conf import settings
from reconcilers.resources import autodiscover, default_registry
from reconcilers.resources.manifests import CURRENT, Manifest, plan_manifests, write_manifests


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser) -> None:
        parser.add_argument("app_labels", nargs="*", metavar="app_label",
                            help="only these apps (default: all)")
        parser.add_argument("--check", action="store_true",
                            help="exit non-zero if a manifest is missing or stale; write nothing")

    def handle(self, *args: str, app_labels: list[str], check: bool, **options) -> None:
        autodiscover()
        try:
            manifests = plan_manifests(default_registry.for_apps(app_labels))
        except LookupError as exc:
            raise CommandError(str(exc)) from exc
        hooked = registration.hooked_resources()
        if settings().webhook_manifests and hooked and not app_labels:
            manifests.append(Manifest(None, Path(settings().webhook_manifests),
                                      registration.cluster_manifests_yaml(hooked)))
        if check:
            outdated = [m for m in manifests if m.state != CURRENT]
            if outdated:
                raise CommandError("manifests are out of date; run `manage.py makecrds`:\n"
                                   + "\n".join(f"  {m.state}: {os.path.relpath(m.path)}"
                                                for m in outdated))
            self.stdout.write(f"{len(manifests)} manifest(s) up to date.")
            return
        written = write_manifests(manifests)
        for manifest in written:
            self.stdout.write(f"Wrote {os.path.relpath(manifest.path)}")
        if not written:
            self.stdout.write("No changes.")

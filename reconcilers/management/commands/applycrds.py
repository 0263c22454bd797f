"""Server-side apply the CRDs of declared resources and wait until they are Established.

Reports ``created``, ``updated`` or ``unchanged`` per CRD; running it twice is safe.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from reconcilers._kube import kube
from reconcilers.resources import NotEstablished, apply_crds, autodiscover, default_registry


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser) -> None:
        parser.add_argument("app_labels", nargs="*", metavar="app_label",
                            help="only these apps (default: all)")
        parser.add_argument("--timeout", type=float, default=60.0,
                            help="seconds to wait for the CRDs to be Established (default 60)")

    def handle(self, *args: str, app_labels: list[str], timeout: float, **options) -> None:
        autodiscover()
        try:
            resources = default_registry.for_apps(app_labels)
        except LookupError as exc:
            raise CommandError(str(exc)) from exc
        if not resources:
            raise CommandError("no resources are declared (is the app in INSTALLED_APPS?)")
        try:
            results = apply_crds(resources, kube.api_client(), timeout=timeout)
        except kube.ApiError as exc:
            raise CommandError(f"applying CRDs failed: {exc.message}") from exc
        except NotEstablished as exc:
            raise CommandError(str(exc)) from exc
        for name, outcome in results:
            self.stdout.write(f"{name}: {outcome}")

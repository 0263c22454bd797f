"""``python manage.py resync <reconciler> [--namespace NS] [--name NAME]``: enqueue by hand.

Goes through the ledger like every other trigger (``manual``): a key already queued or running
is merged, never run twice at once.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from reconcilers._queue import resync
from reconcilers._authoring import validation
from reconcilers._authoring.registry import registry


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser) -> None:
        parser.add_argument("reconciler", help="e.g. foos.samplecontroller.k8s.io")
        parser.add_argument("--namespace", "-n", default=None)
        parser.add_argument("--name", default=None, help="one object (default: every known one)")

    def handle(self, *args, reconciler: str, namespace: str | None, name: str | None,
               **options) -> None:
        if reconciler not in registry:
            raise CommandError(f"unknown reconciler {reconciler!r}; registered: "
                               f"{', '.join(registry.names()) or 'none'}")
        try:
            validation.check_object_ref(registry.get_class(reconciler), namespace, name)
        except ValueError as e:
            raise CommandError(str(e)) from None
        count = resync.resync(reconciler, namespace, name)
        self.stdout.write(f"enqueued {count} key(s) of {reconciler}")

"""``python manage.py history <reconciler> <namespace>/<name> [--json]``: one object's runs."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from reconcilers._run import history
from reconcilers._base.vocab import split_object_path
from reconcilers._base.reconcile import Key


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser) -> None:
        parser.add_argument("reconciler")
        parser.add_argument("object", help="<namespace>/<name>, or <name> if cluster-scoped")
        parser.add_argument("--json", action="store_true", help="one JSON object per line")

    def handle(self, *args, reconciler: str, object: str, **options) -> None:
        namespace, name = split_object_path(object)
        if not name:
            raise CommandError("give the object as <namespace>/<name>")
        records = history.for_key(Key(reconciler, namespace, name))
        if not records.exists():
            raise CommandError(f"no runs recorded for {reconciler} {object}")
        for r in records:
            row = {
                "start": r.started_at.isoformat(), "end": r.finished_at.isoformat(),
                "outcome": r.outcome, "triggers": r.triggers, "attempt": r.attempt,
                "resourceVersion": r.resource_version, "generation": r.generation,
                "worker": r.worker, "durationMs": round(r.duration_ms, 1),
                "error": r.error_message,
            }
            if options["json"]:
                self.stdout.write(json.dumps(row))
            else:
                self.stdout.write(
                    f"{row['start']}  {row['durationMs']:>8.1f}ms  {r.outcome:<13} "
                    f"attempt={r.attempt:<3} rv={r.resource_version:<8} gen={r.generation} "
                    f"triggers={','.join(r.triggers) or '-'}  {r.worker}"
                    + (f"  {r.error_message[:120]}" if r.error_message else ""))

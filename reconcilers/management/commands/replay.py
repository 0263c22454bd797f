"""``manage.py replay <record id> [--as-test]``: run a recorded run again with today's code."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from reconcilers._run import replay


class Command(BaseCommand):
    help = ("Run the current code of a recorded run's reconciler against exactly what that run "
            "read (writes captured, never sent), and show both outcomes; --as-test prints a "
            "pytest module that keeps the inputs as a regression test.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("record_id", type=int, help="the run's id (the history's #)")
        parser.add_argument("--as-test", action="store_true",
                            help="print a regression test of this run instead")

    def handle(self, *args, record_id: int, as_test: bool, **options) -> None:
        try:
            if as_test:
                self.stdout.write(replay.regression_test(record_id))
                return
            result = replay.replay(record_id)
        except replay.NotReplayable as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(result.report())

"""``python manage.py watch``: run the watch workers until SIGTERM / Ctrl-C."""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys
import threading
import uuid

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from reconcilers._authoring.registry import registry
from reconcilers._queue import checks
from reconcilers._run import timers
from reconcilers._run.runner import worker_identity
from reconcilers._watch.lifecycle import Watcher


class Command(BaseCommand):
    help = __doc__.splitlines()[0]
    # What a watcher depends on: the framework's own checks and the models'. The rest (URLs,
    # admin, templates) concern the web role, and would only delay a restarted watcher.
    requires_system_checks = [checks.TAG, "models"]

    def add_arguments(self, parser) -> None:
        parser.add_argument("reconcilers", nargs="*", help="only these (default: all)")

    def run_from_argv(self, argv: list[str]) -> None:
        """From the command line, exit as soon as the watch has stopped and its Lease is
        released, skipping the interpreter's own teardown (freeing every module and object one
        by one): nothing of it is needed once the Lease is let go, and a rolling restart waits
        for it. What a normal exit must still do (the exit hooks, the streams' flush) runs
        first. Errors still exit through Django's handling; ``call_command`` returns as usual.

        The process's start-up heap is frozen first: what Django's set-up imported (modules,
        classes, settings, the apps) lives as long as the process, so the cyclic collector
        would only walk it again in every full collection and find nothing. None of it is
        garbage yet (a collection at this point frees nothing), so freezing keeps nothing
        alive that would otherwise go; objects made later are collected as usual."""
        gc.freeze()
        super().run_from_argv(argv)
        connections.close_all()
        atexit._run_exitfuncs()  # what a normal exit runs: logging's flush, the metrics dir
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(0)

    def handle(self, *args, **options) -> None:
        names = options["reconcilers"] or registry.names()
        unknown = [n for n in names if n not in registry]
        if unknown:
            raise CommandError(f"unknown reconciler(s) {unknown}; registered: {registry.names()}")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        # Unique per process even where containers share a host name and pid numbers.
        identity = f"{worker_identity()}:{uuid.uuid4().hex[:8]}"
        Watcher(identity, declares_timers=timers.any_declared,
                out=self.stdout, err=self.stderr).run(names, until=stop)

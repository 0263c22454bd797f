"""``python manage.py watch``: run the watch workers until SIGTERM / Ctrl-C."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import signal
import sys
import threading
import uuid

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections, connections

from reconcilers._queue import broker, checks, periodic, workqueue
from reconcilers._kube import cache
from reconcilers._authoring import crds
from reconcilers._watch import leader, onstart, scopes, watcher
from reconcilers._base import probes
from reconcilers._run import timers
from reconcilers._base.conf import process_setting, settings
from reconcilers.models import RegisteredReconciler
from reconcilers._authoring.registry import registry
from reconcilers._run.runner import worker_identity

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = __doc__.splitlines()[0]
    # What a watcher depends on: the framework's own checks and the models'. The rest (URLs,
    # admin, templates) concern the web role, and would only delay a restarted watcher.
    requires_system_checks = [checks.TAG, "models"]

    def add_arguments(self, parser) -> None:
        parser.add_argument("reconcilers", nargs="*", help="only these (default: all)")

    def run_from_argv(self, argv: list[str]) -> None:
        """From the command line, exit as soon as the watch has stopped and its Lease is
        released: the interpreter's own teardown of a process this size (freeing every module
        and object one by one) took 0.25-0.35 s, time a rolling restart waits for nothing.
        Errors still exit through Django's handling; ``call_command`` returns as usual.

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
        health = watcher.Health()
        probes.serve(health.endpoint(),
                     process_setting("OPERATOR_WATCHER_HTTP_PORT", 8081))
        if not names:
            # Idle rather than exit: a restart loop helps nobody; the message says what to do.
            self.stderr.write("no reconcilers are registered: add an app with a reconcilers.py "
                              "to INSTALLED_APPS (or OPERATOR_SAMPLES=1); idling")
            while not stop.wait(5):
                watcher.heartbeat(identity)
                health.tick()
            return
        classes = [registry.get_class(n) for n in names]
        onstart.mode()  # a bad RECONCILERS_RECONCILE_ON_START stops the start, not the leader
        # The sender connects while start-up waits on PostgreSQL and the api-server, so a
        # restarted watcher's first key does not wait for the broker connection.
        threading.Thread(target=_ready_sender, daemon=True, name="sender").start()
        if not self._start_up(classes, stop, health):
            return

        elector = campaign = None
        conf = settings()
        lease = f"{conf.lease_namespace}/{conf.lease_name}"
        if conf.leader_election:
            elector = leader.LeaderElector(
                identity, conf.lease_namespace, conf.lease_name, conf.leader_lease_seconds,
                fence=lambda number: cache.raise_fence(cache.Term(lease, number)))
            campaign = threading.Thread(target=elector.run, args=(stop,), daemon=True)
            campaign.start()
        health.elector = elector

        self.stdout.write(f"watching {', '.join(names)} as {identity}", ending="\n")
        self.stdout.flush()
        while not stop.is_set():
            if elector is not None and not elector.is_leader.wait(1):
                watcher.heartbeat(identity)
                health.tick()
                continue
            # Every cache write of this term's streams carries it: once a successor's is in
            # Redis, they write nothing (``cache.FencedBatch``).
            fence = None if elector is None else cache.Term(lease, elector.term)
            self.stdout.write("leading: starting streams"
                              + (f" (term {fence.number})" if fence else ""))
            self.stdout.flush()
            term = threading.Event()
            enqueuer = watcher.Enqueuer(term)
            enqueuer.start()
            if conf.watcher_schedules:
                periodic.Sender(periodic.schedule(timers.any_declared(classes)),
                                broker.send_periodic,
                                until=term.is_set).start()
            streams = watcher.build_streams(classes, enqueuer, term, identity, term=fence)
            forgetting = self._announce(classes, stop)
            self._replay(streams, stop)
            start_pass = onstart.StartPass(classes)

            def tick(running: list) -> None:
                start_pass(running)
                forgetting()

            watcher.run_streams(streams, until=lambda: stop.is_set() or (
                elector is not None and (not elector.is_leader.is_set()
                                         or elector.term != fence.number)),
                identity=identity, health=health, wake=stop, tick=tick)
            term.set()
            enqueuer.stop()
            enqueuer.join(15)
        if campaign is not None:
            campaign.join(10)  # its Lease released, so a successor leads at once
        self.stdout.write("watch stopped")

    def _announce(self, classes: list, stop: threading.Event) -> scopes.Forgetting:
        """Record what this deployment covers now (``scopes``) and drop the synced markers of
        what it stopped covering, before the first run reads from the cache; the keys there
        are forgotten by what this returns, called with every tick of the streams."""
        delay = 0.5
        while not stop.is_set():
            try:
                conf = settings()
                previous = scopes.announce(conf.lease_name,
                                           scopes.of(classes, conf.namespace_list))
                dropped = scopes.dropped(previous)
                for name, namespaces in dropped.items():
                    if name not in registry:
                        continue
                    cls = registry.get_class(name)
                    for gvr in {cls.primary(), *(o.gvr() for o in cls.owns),
                                *(w.gvr() for w in cls.watches)}:
                        for namespace in namespaces:
                            cache.drop_synced(gvr, namespace)
                    self.stdout.write(f"{name}: no longer watching "
                                      f"{', '.join(n or 'every namespace' for n in namespaces)}"
                                      "; its keys there are forgotten")
                forgetting = scopes.Forgetting(dropped)
                forgetting()
                return forgetting
            except Exception as exc:
                self.stderr.write(f"could not announce this watcher's scope "
                                  f"({type(exc).__name__}: {exc}); retrying in {delay:.1f}s")
                stop.wait(delay)
                delay = min(delay * 2, 10.0)
        return scopes.Forgetting({})

    def _replay(self, streams: list, stop: threading.Event) -> None:
        """Replay the journal before streaming, waiting out a Redis outage: the entries there
        are changes nobody enqueued yet (if Redis lost them, the relist finds them instead)."""
        delay = 0.5
        while not stop.is_set():
            try:
                replayed = watcher.replay_journal(streams)
                if replayed:
                    self.stdout.write(f"replayed {replayed} changes a previous watcher had "
                                      "not enqueued")
                return
            except Exception as exc:
                self.stderr.write(f"journal replay failed ({type(exc).__name__}: {exc}); "
                                  f"retrying in {delay:.1f}s")
                stop.wait(delay)
                delay = min(delay * 2, 10.0)

    def _start_up(self, classes: list, stop: threading.Event, health: watcher.Health) -> bool:
        """Record the reconcilers and install their CRDs, retrying while PostgreSQL or the
        api-server is unreachable: a watcher restarted during an outage waits it out instead
        of exiting. False when told to stop first."""
        delay = 0.5
        while not stop.is_set():
            try:
                close_old_connections()
                RegisteredReconciler.sync_from(classes)
                crds.sync_registered(classes, self.stdout)
                return True
            except Exception as exc:
                self.stderr.write(f"start-up failed ({type(exc).__name__}: {exc}); "
                                  f"retrying in {delay:.1f}s")
                health.tick()  # waiting out an outage is alive, not hung
                stop.wait(delay)
                delay = min(delay * 2, 10.0)
        return False


def _ready_sender() -> None:
    """Connect the sender a leader needs ahead of leading. A failure is only a slower first
    message: the enqueuer connects again when it leads."""
    try:
        workqueue.connect_sender()
    except Exception as exc:
        log.warning("could not connect the sender ahead of leading: %s", exc)

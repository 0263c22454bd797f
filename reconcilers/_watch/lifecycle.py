"""The watcher's lifecycle, as controller-runtime's ``Manager``: everything ``manage.py watch``
runs between its arguments and its exit.

``Watcher.run(names, until)``:

1. serve the probes (``Health``), record the reconcilers and install their CRDs, waiting out a
   PostgreSQL or api-server outage rather than exiting;
2. campaign for the Lease (``leader``) when leader election is on;
3. for each term it leads: start the enqueuer and, if configured, the periodic sender; build
   the streams, fenced by the term; announce this deployment's scope (``scopes``); replay the
   journal; then supervise the streams (``run_streams``: a thread each, the heartbeat, the
   synced markers kept alive, every stream relisted when Redis lost or went back on what it
   wrote (``epoch``), the status rows flushed) with the start pass (``onstart``) and
   the scope forgetting on every tick, until told to stop or the term ends;
4. on stop, release the Lease so a successor leads at once.

The command only parses its arguments and turns signals into ``until``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Callable, Iterable, TextIO

from django.db import close_old_connections, connection

from reconcilers._authoring import crds
from reconcilers._authoring.reconciler import Reconciler
from reconcilers._authoring.registry import registry
from reconcilers._base import probes
from reconcilers._base.conf import process_setting, settings
from reconcilers._base.vocab import GVR
from reconcilers._kube import cache, reviews
from reconcilers._kube.epoch import Epoch
from reconcilers._kube.fence import Term, raise_fence
from reconcilers._queue import broker, periodic, workqueue
from reconcilers._watch import leader, onstart, scopes
from reconcilers._watch.enqueuer import Enqueuer
from reconcilers._watch.health import Health, heartbeat
from reconcilers._watch.streams import Stream, build_streams, replay_journal
from reconcilers.models import RegisteredReconciler

log = logging.getLogger(__name__)


class Watcher:
    """One watcher process: its identity, where it reports, and whether its reconcilers'
    timers need the periodic ``reconcilers.timers`` task (``declares_timers``, asked of the
    running side, which owns timers)."""

    def __init__(self, identity: str, *,
                 declares_timers: Callable[[Iterable[type[Reconciler]]], bool] = lambda _: False,
                 out: TextIO | None = None, err: TextIO | None = None):
        self.identity = identity
        self.declares_timers = declares_timers
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.health = Health()

    def run(self, names: list[str], until: threading.Event) -> None:
        """Watch the reconcilers ``names`` (registered ones) until ``until`` is set."""
        health = self.health
        probes.start(health.endpoint(), process_setting("OPERATOR_WATCHER_HTTP_PORT", 8081),
                     process_setting("OPERATOR_WATCHER_METRICS_PORT", 8443),
                     reviews.secure_metrics(), process_setting("OPERATOR_HTTP_HOST", "0.0.0.0"))
        if not names:
            # Idle rather than exit: a restart loop helps nobody; the message says what to do.
            self._warn("no reconcilers are registered: add an app with a reconcilers.py "
                       "to INSTALLED_APPS (or OPERATOR_SAMPLES=1); idling")
            while not until.wait(5):
                heartbeat(self.identity)
                health.tick()
            return
        classes = [registry.get_class(n) for n in names]
        onstart.mode()  # a bad RECONCILERS_RECONCILE_ON_START stops the start, not the leader
        # The sender connects while start-up waits on PostgreSQL and the api-server, so a
        # restarted watcher's first key does not wait for the broker connection.
        threading.Thread(target=_ready_sender, daemon=True, name="sender").start()
        if not self._start_up(classes, until):
            return

        elector = campaign = None
        conf = settings()
        lease = f"{conf.lease_namespace}/{conf.lease_name}"
        if conf.leader_election:
            elector = leader.LeaderElector(
                self.identity, conf.lease_namespace, conf.lease_name, conf.leader_lease_seconds,
                fence=lambda number: raise_fence(Term(lease, number)))
            campaign = threading.Thread(target=elector.run, args=(until,), daemon=True)
            campaign.start()
        health.elector = elector

        self._say(f"watching {', '.join(names)} as {self.identity}")
        while not until.is_set():
            if elector is not None and not elector.is_leader.wait(1):
                heartbeat(self.identity)
                health.tick()
                continue
            # Every cache write of this term's streams carries it: once a successor's is in
            # Redis, they write nothing (``fence.FencedBatch``).
            fence = None if elector is None else Term(lease, elector.term)
            self._say("leading: starting streams"
                      + (f" (term {fence.number})" if fence else ""))
            self._lead(classes, until, elector, fence)
        if campaign is not None:
            campaign.join(10)  # its Lease released, so a successor leads at once
        self._say("watch stopped")

    def _lead(self, classes: list[type[Reconciler]], stop: threading.Event,
              elector: leader.LeaderElector | None, fence: Term | None) -> None:
        """One term: its enqueuer, periodic sender and streams, until it ends or ``stop``."""
        term = threading.Event()
        enqueuer = Enqueuer(term)
        enqueuer.start()
        if settings().watcher_schedules:
            periodic.Sender(periodic.schedule(self.declares_timers(classes)),
                            broker.send_periodic, until=term.is_set).start()
        streams = build_streams(classes, enqueuer, term, self.identity, term=fence)
        forgetting = self._announce(classes, stop)
        self._replay(streams, stop)
        start_pass = onstart.StartPass(classes, enqueuer)

        def tick(running: list) -> None:
            start_pass(running)
            forgetting()

        run_streams(streams, until=lambda: stop.is_set() or (
            elector is not None and (not elector.is_leader.is_set()
                                     or elector.term != fence.number)),
            identity=self.identity, health=self.health, wake=stop, tick=tick)
        term.set()
        enqueuer.stop()
        enqueuer.join(15)

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
                    self._say(f"{name}: no longer watching "
                              f"{', '.join(n or 'every namespace' for n in namespaces)}"
                              "; its keys there are forgotten")
                forgetting = scopes.Forgetting(dropped)
                forgetting()
                return forgetting
            except Exception as exc:
                self._warn(f"could not announce this watcher's scope "
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
                replayed = replay_journal(streams)
                if replayed:
                    self._say(f"replayed {replayed} changes a previous watcher had "
                              "not enqueued")
                return
            except Exception as exc:
                self._warn(f"journal replay failed ({type(exc).__name__}: {exc}); "
                           f"retrying in {delay:.1f}s")
                stop.wait(delay)
                delay = min(delay * 2, 10.0)

    def _start_up(self, classes: list, stop: threading.Event) -> bool:
        """Record the reconcilers and install their CRDs, retrying while PostgreSQL or the
        api-server is unreachable: a watcher restarted during an outage waits it out instead
        of exiting. False when told to stop first."""
        delay = 0.5
        while not stop.is_set():
            try:
                close_old_connections()
                RegisteredReconciler.sync_from(classes)
                crds.sync_registered(classes, self.out)
                return True
            except Exception as exc:
                self._warn(f"start-up failed ({type(exc).__name__}: {exc}); "
                           f"retrying in {delay:.1f}s")
                self.health.tick()  # waiting out an outage is alive, not hung
                stop.wait(delay)
                delay = min(delay * 2, 10.0)
        return False

    def _say(self, text: str) -> None:
        """A line for whoever runs the watcher, written at once: tests and operators wait
        for these lines (``leading: starting streams``)."""
        self.out.write(text + "\n")
        self.out.flush()

    def _warn(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()


def _ready_sender() -> None:
    """Connect the sender a leader needs ahead of leading. A failure is only a slower first
    message: the enqueuer connects again when it leads."""
    try:
        workqueue.connect_sender()
    except Exception as exc:
        log.warning("could not connect the sender ahead of leading: %s", exc)


def run_streams(streams: list[Stream], until: Callable[[], bool], identity: str,
                health: Health | None = None, wake: threading.Event | None = None,
                tick: Callable[[list[Stream]], None] | None = None) -> None:
    """Run streams in threads until ``until()`` is true; heartbeat meanwhile, and call
    ``tick(streams)`` (the start pass) each second. Setting ``wake`` (the process's stop event)
    makes it look at once rather than at its next tick."""
    health = health or Health()
    health.streams = streams
    epoch = Epoch()
    _redis_kept(epoch, [])  # what Redis holds before any stream writes: the first comparison
    threads = [threading.Thread(target=s.run, daemon=True, name=f"stream:{s.gvr.id}")
               for s in streams]
    for t in threads:
        t.start()
    while not until():
        heartbeat(identity)
        health.tick()
        _redis_kept(epoch, streams)
        for s in streams:
            # Keep the synced marker alive; if Redis restarted empty it is gone: relist.
            if (s.status.resource_version and not s.reflector.relist_requested.is_set()
                    and not _keep_synced(s.gvr, s.namespace)):
                s.reflector.request_relist()
            s.status.save()  # flushes counters of a quiet stream (throttled to every 5 s)
        if tick is not None:
            tick(streams)
        # Heartbeat each second, but notice a stop at once: a restarted watcher's successor
        # waits for this one to let go.
        for _ in range(20):
            if until():
                break
            if wake is not None:
                wake.wait(0.05)
            else:
                time.sleep(0.05)
    for s in streams:
        s.abort()
    for t in threads:
        t.join(15)
    for s in streams:
        s.status.save()  # how each stream ended
    health.streams = []
    connection.close()


def _redis_kept(epoch: Epoch, streams: list[Stream]) -> None:
    """Relist every stream if Redis lost or went back on what the watcher wrote (``epoch``).

    A stream whose synced marker Redis still holds came back with older data, which runs may
    read as complete: the marker is dropped, so runs read the api-server until the relist
    marks the scope again, and the relist reports what differs from the cache - each object
    created, changed or deleted in the lost window runs again. A stream whose marker is gone
    relists as after Redis restarted empty: runs read the api-server meanwhile, so only what
    differs from its memory is reported."""
    try:
        if epoch.check():
            return
    except Exception as exc:  # Redis unreachable: compared once it answers again
        log.debug("could not compare Redis with what the watcher wrote: %s", exc)
        return
    log.warning("Redis lost or went back on the cache (%s): relisting %d streams",
                epoch.last_change, len(streams))
    for s in streams:
        try:
            restored = cache.drop_synced(s.gvr, s.namespace)
        except Exception:  # gone again: relisted all the same, against its memory
            restored = False
        s.reflector.request_relist(against_cache=restored)


def _keep_synced(gvr: GVR, namespace: str | None) -> bool:
    try:
        return cache.keep_synced(gvr, namespace)
    except Exception:  # Redis unreachable: nothing to refill yet
        return True

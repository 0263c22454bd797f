"""The worker's health: its ``/metrics``, ``/healthz`` and ``/readyz``, and the watch on its
consumer (``stall``), served by its main process beside Celery's own work; and
``manage.py health worker``'s check from inside its container: a Celery control ping
addressed to *this* container's worker node. The reply comes from the worker's consumer loop,
so it proves the worker is connected to the broker and consuming. Which node is "ours" is
read from the processes' command lines (``processes``): under host networking every container
shares the host's name, so the name alone cannot tell scaled replicas apart.
"""

from __future__ import annotations

import logging
import threading
import time

from celery import bootsteps, current_app, signals
from celery.utils.nodenames import default_nodename, host_format
from celery.worker import state
from django import db

from reconcilers._authoring.registry import registry
from reconcilers._base import metrics, probes, processes
from reconcilers._base.conf import process_setting, settings
from reconcilers._kube import reviews
from reconcilers._queue import broker
from reconcilers._run import evidence, pool, runner, stall

log = logging.getLogger(__name__)


class WorkerProbes:
    """The worker's ``/metrics``, ``/healthz`` and ``/readyz`` (``OPERATOR_WORKER_HTTP_PORT``;
    ``/metrics`` on ``OPERATOR_WORKER_METRICS_PORT`` when secured), served by its main
    process: live while its consumer has not shut down and has not stalled (``stall``), ready
    while it consumes (not stalled either) from the broker and PostgreSQL answers. Its scrape
    adds the pool's size and the runs in progress (children count everything else into the
    multiprocess files)."""

    def __init__(self, consumer) -> None:
        self.consumer = consumer
        self.last_received = time.monotonic()
        self._reading: threading.Thread | None = None
        self._unsure_why: str | None = None
        self._sightings = stall.Sightings()  # the probes' threads and the watch share it
        self._sighting = threading.Lock()
        # The queues it started to consume: a stalled consumer's own list is not to be trusted.
        self.queues = list(consumer.app.amqp.queues.consume_from or ()) or [
            broker.default_queue()]
        signals.task_received.connect(self._received, weak=False)

    def _received(self, **_) -> None:
        self.last_received = time.monotonic()

    def live(self) -> dict[str, bool]:
        why = self.stalled()
        if why:
            log.error("worker not live: %s", why)
        return {"worker": self.consumer.controller.blueprint.state in (None, bootsteps.RUN),
                "consuming": why is None}

    def stalled(self) -> str | None:
        """Why the consumer looks stalled (``stall.stalled``), or ``None``."""
        after = settings().worker_stalled_after
        now = time.monotonic()
        if after <= 0 or now - self.last_received < after:
            return None  # the cheap tests first: most probes end here
        running = self._running(after)
        if running:
            self._unsure(f"{running} task(s) in progress", logging.INFO)
            return None
        oldest = self._oldest_waiting()
        if oldest is None:  # cannot tell: readiness reports the broker, a restart would not help
            self._unsure("its queues could not be read in time", logging.WARNING)
            return None
        self._unsure(None)
        with self._sighting:
            waited = self._sightings.waited(oldest, time.monotonic())
        return stall.stalled(now=now, last_received=self.last_received, running=running,
                             waited=waited, stalled_after=after)

    def _unsure(self, why: str | None, level: int = logging.INFO) -> None:
        """Log, once per change, why a worker that received nothing for a while is not judged
        stalled: a check that stays blind must be seen, not silent."""
        if why != self._unsure_why and why is not None:
            log.log(level, "worker received nothing for %.0f s and is not judged stalled: %s",
                    time.monotonic() - self.last_received, why)
        self._unsure_why = why

    def watch(self) -> None:
        """Ends this worker once it has stayed stalled ``RECONCILERS_WORKER_STALLED_AFTER``
        after it was first seen (``stall.end``: compose restarts only what exits)."""
        first = None
        while (after := settings().worker_stalled_after) > 0:
            time.sleep(max(1.0, after / 4))
            why = self.stalled()
            if why is None:
                first = None
            elif first is None:
                first = time.monotonic()
            elif time.monotonic() - first >= after:
                stall.end(why)
                return

    @staticmethod
    def _running(after: float) -> int:
        """Tasks in progress that can still end (``stall.overdue``)."""
        wall_now = time.time()
        return sum(1 for request in list(state.active_requests)
                   if not stall.overdue(started=request.time_start,
                                        hard_limit=(request.time_limits or (None,))[0]
                                        or getattr(request.task, "time_limit", None),
                                        wall_now=wall_now, stalled_after=after))

    def ready(self) -> dict[str, bool]:
        url = current_app.conf.broker_url
        return {"consuming": self.consumer.blueprint.state == bootsteps.RUN
                and self.stalled() is None,
                "broker": probes.answers(lambda t: probes.check_redis(url, t)),
                "database": probes.answers(probes.check_database)}

    def _oldest_waiting(self, timeout: float = 1.0) -> dict[str, bytes | None] | None:
        """The oldest message of each queue this worker started to consume, read in a
        thread of its own and given ``timeout``: a broker cut off by the network must not hold
        the probe past its own timeout (the kubelet would count that as a failure). ``None``:
        not known in time, or a read is still hanging from an earlier probe."""
        if self._reading is not None and self._reading.is_alive():
            return None
        found: dict[str, dict] = {}

        def read() -> None:
            try:
                found["oldest"] = broker.oldest_waiting(self.queues, timeout) or {}
            except Exception as exc:  # the broker down
                log.warning("could not read this worker's queues: %s", exc)

        self._reading = threading.Thread(target=read, name="stall-check", daemon=True)
        self._reading.start()
        self._reading.join(timeout)
        return found.get("oldest")

    def gauges(self) -> list[tuple[str, str, list[str], list]]:
        active: dict[str, int] = {cls.name(): 0 for cls in registry}
        if pool.configured():  # the runs are this process's threads: count keys
            for name, n in runner.in_progress().items():
                if name in active:
                    active[name] = n
        else:  # a prefork child runs one key at a time: count the messages it was given
            for request in list(state.active_requests):
                name = request.task_name.partition(":")[2]
                if request.task_name.startswith("reconcile:") and name in active:
                    active[name] += 1
        concurrency = self.consumer.controller.concurrency
        return [
            ("controller_runtime_max_concurrent_reconciles",
             "Maximum number of concurrent reconciles per controller", ["controller"],
             [((name,), concurrency) for name in active]),
            ("controller_runtime_active_workers",
             "Number of currently used workers per controller", ["controller"],
             [((name,), n) for name, n in active.items()]),
        ]


def serve(sender, **_) -> None:
    """Celery's ``worker_ready``: the probes, and the watch that ends a worker stalled for
    good (``WorkerProbes.watch``)."""
    worker = WorkerProbes(sender)
    threading.Thread(target=worker.watch, name="stall-watch", daemon=True).start()
    probes.start(probes.Endpoint("worker", worker.live, worker.ready,
                                 [metrics.Computed(worker.gauges)], _scraped),
                 process_setting("OPERATOR_WORKER_HTTP_PORT", 8082),
                 process_setting("OPERATOR_WORKER_METRICS_PORT", 8444),
                 reviews.secure_metrics(), process_setting("OPERATOR_HTTP_HOST", "0.0.0.0"))


def _scraped(body: bytes) -> None:
    """Level 4's evidence: this scrape served metric families reconcilers declare their own."""
    served = evidence.served_families(body)
    own = [cls.name() for cls in registry if served & set(cls.metrics)]
    if not own:
        return
    try:
        evidence.record_scraped(own)
    finally:
        db.connection.close()  # each scrape has its own thread, and so its own connection


# --- liveness from inside the worker's container (``manage.py health worker``) ---------------


def worker_node(argv: list[str]) -> str | None:
    """The node name a ``celery ... worker`` command line gives its worker, ``%h`` expanded."""
    is_celery = processes.is_python(argv) and any(a.endswith("celery") for a in argv)
    if not is_celery or "worker" not in argv:
        return None
    name = None
    for i, arg in enumerate(argv):
        if arg in ("-n", "--hostname") and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--hostname="):
            name = arg.partition("=")[2]
    return host_format(default_nodename(name))


def local_worker_nodes() -> list[str]:
    """Node names of the Celery workers running here (pool children share their parent's)."""
    nodes = (worker_node(argv) for _, argv in processes.command_lines())
    return sorted({n for n in nodes if n})


def ping_worker(node: str, timeout: float) -> probes.CheckResult:
    """A control ping to ``node`` alone; only that worker's reply counts."""
    start = time.monotonic()
    replies = current_app.control.ping(destination=[node], timeout=timeout)
    if any(node in reply for reply in replies):
        return probes.CheckResult(True, probes.ms_since(start))
    return probes.CheckResult(False, probes.ms_since(start),
                              f"no reply from {node} within {timeout}s")

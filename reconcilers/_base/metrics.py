"""Prometheus metrics, named as controller-runtime names them.

A kubebuilder dashboard or alert (``controller_runtime_reconcile_total``,
``workqueue_depth``, ...) works unchanged against an operator built with this project; the
``controller`` / ``name`` label is the reconciler's name. The project's own figures (watch
events, relists, cache size, leadership, ledger states, messages, the reaper, history writes)
are prefixed ``operator_``.

Every series a controller-runtime manager starts at 0 exists here from the first scrape too,
for every registered reconciler (``initialise``): a dashboard's ``rate()`` and an alert's
``absent()`` see a quiet controller, not a missing one.

Where each figure is counted:

- a run (worker pool process): reconcile totals, errors, times, queue and work durations,
  retries, stale messages dropped, history write time;
- anything that adds or sends (watcher, web, beat tasks): adds, messages sent, reaper
  recoveries;
- anything that calls the api-server (``kube.request``): requests by code, method and host,
  as client-go counts them; the watcher's leader election: its Lease's status;
- at scrape time (``collectors``): the worker's concurrency and active runs, the watcher's
  leadership and cache, and - from the leader only, so each figure has one source - the
  ledger's depth, states and running times; the serving process's ``process_*`` and
  ``python_*`` figures (prometheus_client's collectors, which its multiprocess mode leaves
  out).

Prefork workers run reconciles in child processes, so values live in prometheus_client's
multiprocess files: ``PROMETHEUS_MULTIPROC_DIR`` if the deployer sets it (and empties it at
start), else a private directory per program, shared with the processes it forks. It must be
known before ``prometheus_client`` is imported, and before a process forks, which is why
``settle`` chooses it (and only then imports ``prometheus_client`` and declares the figures):
as Django starts (the app's ``AppConfig``, before any app's models or ``ready()``: a
project's own modules may import ``prometheus_client``), else at a program's first use of a
figure. Importing this module does nothing else: no directory, no environment variable.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import threading
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
_MADE_ENV = "OPERATOR_METRICS_MADE_DIR"  # marks a directory this module made, not the deployer


def _multiprocess_dir() -> str:
    """The deployer's directory, or a new private one. A directory another program made for
    itself (inherited through the environment by a process it started) is not shared: this
    runs once per program, when it settles - prefork children inherit the settled module,
    never re-run it."""
    path = os.environ.get(_DIR_ENV)
    if path and path != os.environ.get(_MADE_ENV):
        os.makedirs(path, exist_ok=True)
        return path
    path = tempfile.mkdtemp(prefix="operator-metrics-")
    os.environ[_DIR_ENV] = os.environ[_MADE_ENV] = path
    owner = os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(path, ignore_errors=True))
    return path


# OPERATOR_METRICS=0: every figure below is a no-op and /metrics is empty - for a benchmark's
# baseline, or a deployment that wants no metrics at all.
ENABLED = os.environ.get("OPERATOR_METRICS", "1") != "0"


class _Off:
    """A metric that records nothing (``OPERATOR_METRICS=0``)."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def labels(self, *values: str) -> "_Off":
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def dec(self, amount: float = 1) -> None:
        pass


# controller-runtime's reconcile-time buckets (seconds).
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6,
               0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8,
               9, 10, 15, 20, 25, 30, 40, 50, 60)
# client-go's workqueue buckets: 10^-8 .. 10^1 seconds, plus longer waits a ledger can see.
QUEUE_BUCKETS = (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0, 60.0, 600.0)


def _declare(Counter: Any, Gauge: Any, Histogram: Any) -> dict[str, Any]:
    """Every figure, by the name other modules read it as (``metrics.adds_total``)."""
    reconcile_total = Counter(
        "controller_runtime_reconcile_total", "Total number of reconciliations per controller",
        ["controller", "result"])
    reconcile_errors_total = Counter(
        "controller_runtime_reconcile_errors_total",
        "Total number of reconciliation errors per controller", ["controller"])
    terminal_reconcile_errors_total = Counter(
        "controller_runtime_terminal_reconcile_errors_total",
        "Total number of terminal reconciliation errors per controller", ["controller"])
    # A Python reconciler has no panics: an exception is an error (counted above). Declared so
    # the family controller-runtime exports, and alerts on it, exist.
    reconcile_panics_total = Counter(
        "controller_runtime_reconcile_panics_total",
        "Total number of reconciliation panics per controller", ["controller"])
    reconcile_time_seconds = Histogram(
        "controller_runtime_reconcile_time_seconds",
        "Length of time per reconciliation per controller", ["controller"], buckets=RUN_BUCKETS)
    adds_total = Counter(
        "workqueue_adds_total", "Total number of adds handled by workqueue", ["name"])
    queue_duration_seconds = Histogram(
        "workqueue_queue_duration_seconds",
        "How long in seconds an item stays in workqueue before being requested", ["name"],
        buckets=QUEUE_BUCKETS)
    work_duration_seconds = Histogram(
        "workqueue_work_duration_seconds",
        "How long in seconds processing an item from workqueue takes", ["name"],
        buckets=QUEUE_BUCKETS)
    retries_total = Counter(
        "workqueue_retries_total", "Total number of retries handled by workqueue", ["name"])

    # client-go's REST client figures, as controller-runtime registers them. ``code`` is the HTTP
    # status, or ``<error>`` when no answer came; ``method``/``verb`` the HTTP method; ``host`` the
    # api-server's host:port.
    rest_client_requests_total = Counter(
        "rest_client_requests_total",
        "Number of HTTP requests, partitioned by status code, method, and host.",
        ["code", "method", "host"])
    rest_client_request_duration_seconds = Histogram(
        "rest_client_request_duration_seconds",
        "Request latency in seconds. Broken down by verb and host.", ["verb", "host"],
        buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0))
    # client-go's leaderelection figure; ``name`` is the Lease's name. Set by the watcher process
    # alone ("livemax": a process that is gone no longer counts).
    leader_election_master_status = Gauge(
        "leader_election_master_status",
        "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, "
        "1 indicates master. 'name' is the string used to identify the lease. Please make sure "
        "to group by name.", ["name"], multiprocess_mode="livemax")

    # controller-runtime's webhook figures; ``webhook`` is the path served. Declared here (this
    # module declares every figure); the webhook server counts them.
    webhook_requests_total = Counter(
        "controller_runtime_webhook_requests_total",
        "Total number of admission requests by HTTP status code.", ["webhook", "code"])
    webhook_latency_seconds = Histogram(
        "controller_runtime_webhook_latency_seconds",
        "Histogram of the latency of processing admission requests", ["webhook"],
        buckets=tuple(10.0 ** e for e in range(-8, 4)))  # controller-runtime's: 10^-8 .. 10^3 s
    webhook_requests_in_flight = Gauge(
        "controller_runtime_webhook_requests_in_flight",
        "Current number of admission requests being served.", ["webhook"],
        multiprocess_mode="livesum")

    watch_events_total = Counter(
        "operator_watch_events_total", "Watch events received, by resource stream and type",
        ["resource", "namespace", "type"])
    relists_total = Counter(
        "operator_relists_total", "Lists of a resource stream (first list, 410 Gone, requested)",
        ["resource", "namespace", "reason"])
    watch_errors_total = Counter(
        "operator_watch_errors_total", "Failed lists or watches of a resource stream",
        ["resource", "namespace"])
    messages_sent_total = Counter(
        "operator_messages_sent_total",
        "Keys sent to the broker (one per dispatch; a message may carry several)", ["name"])
    messages_unsent_total = Counter(
        "operator_messages_unsent_total",
        "Messages the broker did not take (the reaper sends them again)", ["name"])
    messages_stale_total = Counter(
        "operator_messages_stale_total",
        "Messages dropped because their token was no longer current (duplicates, re-sends)",
        ["name"])
    reaper_recoveries_total = Counter(
        "operator_reaper_recoveries_total",
        "What the reaper recovered: runs whose worker was lost, messages sent again or due",
        ["kind"])
    history_write_seconds = Histogram(
        "operator_history_write_seconds",
        "Time to record a run and end it in the ledger (one transaction)", buckets=RUN_BUCKETS)
    return {name: value for name, value in locals().items()
            if name not in ("Counter", "Gauge", "Histogram")}


# Written once per program, by the first thread to settle (under ``_settling``); read by every
# thread after. Module level because a prefork child must inherit them settled from its parent.
_settling = threading.Lock()
_settled = False


def settle() -> None:
    """Choose where this program's figures live and declare them - once per program, before
    any is counted: the app's ``AppConfig`` does as Django starts, and any first use does in a
    program without Django. A prefork worker's children and a gunicorn master's workers are
    forked after Django's set-up, so they share the directory their parent settled.
    ``prometheus_client`` reads ``PROMETHEUS_MULTIPROC_DIR`` when it is first imported, which
    is why it is imported here, after the directory is known, and nowhere at import."""
    global _settled
    if _settled:
        return
    with _settling:
        if _settled:
            return
        directory = _multiprocess_dir() if ENABLED else ""
        if ENABLED:
            from prometheus_client import Counter, Gauge, Histogram
        else:
            Counter = Gauge = Histogram = _Off
        globals().update(_declare(Counter, Gauge, Histogram), DIRECTORY=directory)
        _settled = True


def __getattr__(name: str) -> Any:
    """A figure or ``DIRECTORY`` read from outside before this program settled: its first use
    settles it."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    settle()
    try:
        return globals()[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


# controller-runtime's result label: success, error, requeue, requeue_after. The project's
# own outcomes count as controller-runtime's reconciler would return them: a permanent error
# is an error (and a terminal one), an object gone or being deleted without our finalizer a
# success.
RESULTS = ("error", "requeue_after", "requeue", "success")
RESULT_OF = {"permanent": "error", "gone": "success", "skipped": "success"}
ERRORS = {"error", "permanent"}

# The reconcilers this process reports on: written by ``initialise`` (the app's ``ready()``, at
# start-up, one thread), read at scrape time. Module level, as the figures are: one set per program.
_controllers: tuple[str, ...] = ()


def initialise(controllers: Iterable[str]) -> None:
    """Report on ``controllers`` (the registered reconcilers; the app's ``ready()`` calls
    this): from the first scrape on, each has every per-controller series - at 0 until
    counted, as a controller-runtime controller's ``initMetrics`` and client-go's work queue
    start them - and a 0 in gauges computed at scrape time that found nothing for it."""
    global _controllers
    settle()
    _controllers = tuple(sorted(set(controllers)))


def _start_series() -> None:
    """The series of ``initialise`` in this process's files (at scrape time, not start-up:
    a process that is never scraped pays nothing; a labelled child costs a dict look-up once
    made)."""
    for name in _controllers:
        for result in RESULTS:
            reconcile_total.labels(name, result)
        for family in (reconcile_errors_total, terminal_reconcile_errors_total,
                       reconcile_panics_total, reconcile_time_seconds, adds_total,
                       queue_duration_seconds, work_duration_seconds, retries_total):
            family.labels(name)  # a labelled child is a series at 0 in the multiprocess files


def observe_run(reconciler: str, outcome: str, seconds: float, retry: bool) -> None:
    """One finished run: its result, its time and whether the ledger retries it."""
    settle()
    reconcile_total.labels(reconciler, RESULT_OF.get(outcome, outcome)).inc()
    if outcome in ERRORS:
        reconcile_errors_total.labels(reconciler).inc()
    if outcome == "permanent":
        terminal_reconcile_errors_total.labels(reconciler).inc()
    reconcile_time_seconds.labels(reconciler).observe(seconds)
    work_duration_seconds.labels(reconciler).observe(seconds)
    if retry:
        retries_total.labels(reconciler).inc()


def observe_lost_run(reconciler: str) -> None:
    """A run whose worker vanished, recorded by the reaper as an error."""
    settle()
    reconcile_total.labels(reconciler, "error").inc()
    reconcile_errors_total.labels(reconciler).inc()


def observe_request(method: str, url: str, code: int | str, seconds: float) -> None:
    """One api-server call: its status (``"<error>"`` for none) and its time to the answer's
    headers, as client-go's REST client records them."""
    count, duration = _request_series(method, url, code)
    count.inc()
    duration.observe(seconds)


@functools.lru_cache(maxsize=256)
def _request_series(method: str, url: str, code: int | str) -> tuple:
    """The two series of a call (every call pays this: a look-up, not ``labels()``'s checks).
    The children are prometheus_client's, which follow a fork to the child's files."""
    settle()
    host = urlsplit(url).netloc
    return (rest_client_requests_total.labels(str(code), method, host),
            rest_client_request_duration_seconds.labels(method, host))


def initialise_webhook(path: str) -> None:
    """A served webhook path's series at 0, as controller-runtime's ``InstrumentedHook``
    starts them (the likeliest codes, 200 and 500)."""
    settle()
    for code in ("200", "500"):
        webhook_requests_total.labels(path, code)
    webhook_latency_seconds.labels(path)
    webhook_requests_in_flight.labels(path)


def leader_status(lease: str, leading: bool) -> None:
    """This process leads (1) or stands by (0) for ``lease``."""
    settle()
    leader_election_master_status.labels(lease).set(1.0 if leading else 0.0)


def exposition(collectors: Iterable[Computed] = ()) -> tuple[bytes, str]:
    """The text a scrape gets: every process's values from the multiprocess directory, the
    serving process's own ``process_*`` / ``python_*``, and the collectors this process
    computes at scrape time."""
    settle()
    from prometheus_client import (CONTENT_TYPE_LATEST, GC_COLLECTOR, PLATFORM_COLLECTOR,
                                   PROCESS_COLLECTOR, CollectorRegistry, generate_latest,
                                   multiprocess)

    registry = CollectorRegistry()
    if not ENABLED:
        return generate_latest(registry), CONTENT_TYPE_LATEST
    _start_series()
    multiprocess.MultiProcessCollector(registry, path=DIRECTORY)
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, *collectors):
        registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST


def process_exited(pid: int) -> None:
    """A child process is gone: drop its live-gauge files (its counters stay counted)."""
    if ENABLED:
        settle()
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, path=DIRECTORY)


class Computed:
    """Gauges computed when scraped, by ``compute()`` -> ``[(name, help, labels, samples)]``
    where samples are ``(label values, value)``. A family labelled by ``controller`` or
    ``name`` alone gets a 0 for every initialised reconciler it has no value for. A failing
    computation (database down) yields nothing instead of failing the scrape. A collector as
    prometheus_client takes one (it needs only ``collect``), made before anything is settled."""

    def __init__(self, compute: Callable[[], list[tuple[str, str, list[str], list]]]):
        self._compute = compute

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily  # scraped, so settled

        try:
            families = self._compute()
        except Exception:  # the scrape must still answer; the failure shows as a gap
            return
        for name, doc, labels, samples in families:
            family = GaugeMetricFamily(name, doc, labels=labels)
            for values, value in samples:
                family.add_metric(list(values), value)
            if labels in (["controller"], ["name"]):
                for missing in set(_controllers) - {values[0] for values, _ in samples}:
                    family.add_metric([missing], 0.0)
            yield family

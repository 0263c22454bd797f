"""The operator's settings (``RECONCILERS_*``): names, types, defaults and docs in one place.

``settings()`` reads them once into a frozen ``Settings``: each from the Django setting of that
name if set, else from the environment variable of that name, else the default below. A value
of the wrong type is an ``ImproperlyConfigured`` at start-up, not a crash at the first retry.
Tests that change a setting (``override_settings``) get a fresh read automatically.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from reconcilers._base.environ import parse_bool, parse_float, parse_int

PREFIX = "RECONCILERS_"


def _s(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class Settings:
    backoff_base: float = _s(0.005, "First retry delay in seconds; doubles per consecutive "
                                    "failure of a key (client-go's default 5 ms).")
    backoff_max: float = _s(1000.0, "Longest retry delay in seconds (client-go's 1000 s).")
    lease_seconds: float = _s(60.0, "Default run deadline in seconds (a reconciler's `timeout` "
                                    "overrides it): past it the run gets an error and a retry "
                                    "with backoff; a run that ignores that is ended.")
    max_countdown: float = _s(300.0, "Longest delay sent as a Celery countdown; longer ones "
                                     "wait in the ledger until the reaper sends them (must be shorter "
                                     "than the broker's visibility timeout; checked at start).")
    redispatch_after: float = _s(60.0, "A queued key whose message left its queue this many "
                                       "seconds ago (judged by the oldest message still "
                                       "waiting) without starting a run is sent again.")
    worker_stalled_after: float = _s(120.0, "A worker in whose queues a message has waited "
                                            "next longer than this (timed on the worker's "
                                            "own clock from when it first saw it there), "
                                            "that received none for as long and "
                                            "runs nothing that can still end (a task past "
                                            "its hard limit by this much is stuck, not "
                                            "busy), answers its liveness probe "
                                            "(`/healthz`) with 503, so its orchestrator "
                                            "restarts it: Celery's Redis consumer can stop "
                                            "consuming after a broker connection reset "
                                            "without exiting. Still so this long later, it "
                                            "ends itself (compose restarts only what "
                                            "exits). 0 = never.")
    reaper_interval: float = _s(10.0, "Seconds between reaper runs (lost runs, lost "
                                      "messages, due retries).")
    resync_period: float = _s(600.0, "Default resync period of a reconciler that declares none "
                                     "(seconds; 0 = never).")
    history_days: int = _s(14, "History older than this many days is pruned (0 = keep).")
    record_inputs: str = _s("failed", "Which runs keep their inputs - the object and every "
                                      "read through ctx - and writes (a Secret's values "
                                      "redacted), for `manage.py replay`: `failed` (error "
                                      "or permanent), `all`, or `off`.")
    record_inputs_max_kb: int = _s(256, "Inputs larger than this many KiB are not kept (the "
                                        "run's history row says so).")
    redact_kinds: str = _s("", "Kinds whose contents kept inputs never hold, besides Secrets "
                               "(always redacted): comma-separated `apiVersion/Kind`, e.g. "
                               "`v1/ConfigMap,example.com/v1/Database`. Of such an object "
                               "only apiVersion, kind and metadata are kept; every other "
                               "value becomes `<redacted>`, its keys kept.")
    history_per_key: int = _s(500, "At most this many history rows are kept per key "
                                   "(0 = no limit).")
    abandoned_runs_max: int = _s(4, "Thread-pool workers: a run still going at its hard "
                                    "limit (blocked outside Python) is recorded as an error, "
                                    "retried with backoff, and its thread abandoned and "
                                    "replaced; past this many abandoned threads still stuck, "
                                    "the worker drains and exits.")
    enqueue_batch: int = _s(1000, "Keys per statement when a relist or resync enqueues many.")
    keys_per_message: int = _s(16, "When many keys of one reconciler are due at once (a "
                                   "relist, a stream of events), up to this many share a "
                                   "message: one delivery and ack for all; each is still "
                                   "claimed, run (at once, up to the worker's concurrency) and "
                                   "recorded on its own. 1 = a message per key. A reconciler "
                                   "with a `rate_limit` or `shared_rate_limit` always gets one "
                                   "per key.")
    enqueue_window: float = _s(0.02, "When keys arrive faster than the watcher enqueues them "
                                     "(some came in while it wrote the last batch), it "
                                     "gathers this many seconds before the next batch (fewer, "
                                     "fuller messages); a key that finds it idle is enqueued "
                                     "at once. 0 = never wait.")
    prepared_statements: bool = _s(True, "The work queue's statements are prepared once per "
                                         "database connection (server-side binding); off "
                                         "behind a connection pooler that cannot keep them "
                                         "(PgBouncer in transaction mode before 1.21).")
    watch_timeout_min: int = _s(300, "Shortest server-side watch timeout (seconds).")
    watch_timeout_max: int = _s(600, "Longest server-side watch timeout (seconds).")
    watch_inactivity: float = _s(90.0, "A watch silent this long (no event, no bookmark) is "
                                       "reconnected.")
    list_page_size: int = _s(500, "Objects per page of a LIST.")
    leader_election: bool = _s(True, "Elect one leading watcher through a Lease.")
    watcher_schedules: bool = _s(True, "The leading watcher sends the periodic tasks (reaper, "
                                       "resync, history pruning) itself; off when a separate "
                                       "celery beat sends them.")
    lease_namespace: str = _s("default", "Namespace of the leader-election Lease.")
    lease_name: str = _s("django-crd-operator-watcher", "Name of the leader-election Lease.")
    leader_lease_seconds: float = _s(15.0, "Lease duration: a standby takes over this long "
                                           "after a leader that died stops renewing (one that "
                                           "stops cleanly releases the Lease, and a standby "
                                           "watching it takes over at once).")
    namespaces: str = _s("", "Comma-separated namespaces to watch (empty = all).")
    reconcile_on_start: str = _s("changed", "A watcher that becomes leader reconciles every "
                                            "object of each reconciler whose code or settings "
                                            "changed since the last leader's pass (`changed`), "
                                            "or of every reconciler (`always`, as "
                                            "controller-runtime).")
    apply_crds: bool = _s(False, "Server-side apply the CRDs of enabled reconcilers when the "
                                 "watcher starts.")
    metrics_secure: bool = _s(False, "The watcher and the workers serve `/metrics` over HTTPS "
                                     "on a port of its own (`OPERATOR_WATCHER_METRICS_PORT`, "
                                     "`OPERATOR_WORKER_METRICS_PORT`), only to a caller whose "
                                     "bearer token the api-server authenticates (TokenReview) "
                                     "and allows `get` on the URL `/metrics` "
                                     "(SubjectAccessReview), as controller-runtime's "
                                     "`WithAuthenticationAndAuthorization`; the probe port "
                                     "keeps `/healthz` and `/readyz`, plain. Needs `create` on "
                                     "tokenreviews and subjectaccessreviews (`manage.py rbac` "
                                     "grants it while this is on). Off: `/metrics` is plain "
                                     "HTTP on the probe port, for anyone who reaches it.")
    metrics_cert_dir: str = _s("", "Directory of the secure `/metrics`'s serving pair, "
                                   "`tls.crt` and `tls.key` (a `kubernetes.io/tls` Secret "
                                   "mounted); empty: a self-signed pair made at start.")
    webhook_manifests: str = _s("", "File `makecrds` keeps the webhook server's cluster "
                                    "manifests in (what `webhook manifests` prints with its "
                                    "defaults; `--check` fails when stale); empty: none.")

    def __post_init__(self) -> None:
        _kinds(self.redact_kinds)  # a malformed list fails the read, not a run's end

    @property
    def redacted_kinds(self) -> frozenset[tuple[str, str]]:
        """``(apiVersion, kind)`` of the objects kept inputs hold no data of: core/v1 Secrets
        always - they hold credentials - and those ``RECONCILERS_REDACT_KINDS`` names."""
        return _kinds(self.redact_kinds) | {("v1", "Secret")}

    @classmethod
    def fields(cls) -> Iterator[dataclasses.Field]:
        return iter(dataclasses.fields(cls))

    @staticmethod
    def setting_name(attribute: str) -> str:
        return PREFIX + attribute.upper()

    @classmethod
    def markdown(cls) -> str:
        """The table of these settings in docs/running/configuration.md (a test keeps the two
        equal)."""
        rows = ["| setting | default | meaning |", "| --- | --- | --- |"]
        for f in cls.fields():
            default = (("on" if f.default else "off") if isinstance(f.default, bool)
                       else f.default if f.default != "" else "(empty)")
            rows.append(f"| `{cls.setting_name(f.name)}` | `{default}` | {f.metadata['doc']} |")
        return "\n".join(rows)

    def table(self) -> list[tuple[str, Any, Any, str]]:
        """``(setting, value in force, default, doc)`` for every setting: the admin shows it."""
        return [(self.setting_name(f.name), getattr(self, f.name), f.default, f.metadata["doc"])
                for f in self.fields()]

    def backoff(self, base: float | None = None, cap: float | None = None) -> "Backoff":
        return Backoff(base or self.backoff_base, cap or self.backoff_max)

    @property
    def namespace_list(self) -> list[str]:
        return [n.strip() for n in self.namespaces.split(",") if n.strip()]


def _kinds(text: str) -> frozenset[tuple[str, str]]:
    """``apiVersion/Kind, ...`` as ``(apiVersion, kind)`` pairs."""
    kinds = set()
    for entry in filter(None, (e.strip() for e in text.split(","))):
        api_version, _, kind = entry.rpartition("/")
        if not api_version.strip("/") or not kind[:1].isupper():
            raise ImproperlyConfigured(
                f"RECONCILERS_REDACT_KINDS: {entry!r} is not apiVersion/Kind (e.g. "
                f"v1/ConfigMap or example.com/v1/Database: the kind, not the plural)")
        kinds.add((api_version, kind))
    return frozenset(kinds)


def process_setting(name: str, default: Any) -> Any:
    """An ``OPERATOR_*`` setting of the processes (ports, health limits): from Django settings,
    else the environment, else ``default`` - so a project that installs the app can set them
    either way, as this repository's project does in its settings from the environment."""
    if hasattr(django_settings, name):
        return getattr(django_settings, name)
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    kind = type(default).__name__
    return _PARSERS[kind](name, raw)


_PARSERS = {"float": parse_float, "int": parse_int, "bool": parse_bool, "str": lambda n, v: v}


def _read(f: dataclasses.Field) -> Any:
    name = Settings.setting_name(f.name)
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    if hasattr(django_settings, name):
        value = getattr(django_settings, name)
        if not isinstance(value, str):
            return _PARSERS[kind](name, str(value)) if kind != "bool" else bool(value)
    else:
        value = os.environ.get(name, "")
        if value == "":
            return f.default
    return _PARSERS[kind](name, value)


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    """The settings in force, read once per process."""
    return Settings(**{f.name: _read(f) for f in Settings.fields()})


def _reset(*, setting: str, **kwargs) -> None:
    if setting.startswith(PREFIX):
        settings.cache_clear()


setting_changed.connect(_reset)


@dataclass(frozen=True)
class RunLimits:
    """A run's deadline and what enforces it.

    ``soft``: user code is interrupted (Celery's soft time limit) and the run recorded as an
    error with backoff. ``hard``: the worker process running it is ended (Celery's time limit).
    ``lease``: how long the key is held; longer than ``hard``, so the reaper only takes a key
    whose run can no longer be acting on the cluster.
    """

    soft: float

    @property
    def hard(self) -> float:
        return self.soft + max(2.0, self.soft / 4)

    @property
    def lease(self) -> float:
        return self.hard + 2.0

    @classmethod
    def of(cls, timeout: float | None) -> "RunLimits":
        return cls(float(timeout or settings().lease_seconds))


@dataclass(frozen=True)
class Backoff:
    """Per-item exponential backoff: ``base * 2**(failures-1)``, capped (client-go's curve)."""

    base: float
    cap: float

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        # Cap the exponent first so a huge failure count cannot overflow a float.
        return min(self.base * (2 ** min(failures - 1, 64)), self.cap)

"""The operator's settings (``RECONCILERS_*``), each with its default here and nowhere else.

Any of them can be set in Django settings or, for the ones marked env, in the environment.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings as django_settings

from operator_project.environ import env_float, env_int

DEFAULTS: dict[str, object] = {
    # Per-item exponential backoff, client-go's defaults: 5 ms doubling up to 1000 s.
    "RECONCILERS_BACKOFF_BASE": 0.005,
    "RECONCILERS_BACKOFF_MAX": 1000.0,
    # A run holds its key for this long unless it renews; a worker killed mid-run loses it.
    "RECONCILERS_LEASE_SECONDS": 60.0,
    # A delay longer than this is kept in the ledger and sent by beat when due, not as a Redis
    # countdown (which Redis would redeliver after the visibility timeout).
    "RECONCILERS_MAX_COUNTDOWN": 300.0,
    # A queued key whose message has not started a run after this long is sent again.
    "RECONCILERS_REDISPATCH_AFTER": 60.0,
    # How often beat runs the reaper / the due-work sweep / the resync check (seconds).
    "RECONCILERS_REAPER_INTERVAL": 10.0,
    # Default resync period of a reconciler that declares none (seconds; 0 = never).
    "RECONCILERS_RESYNC_PERIOD": 600.0,
    # History retention: rows older than this many days are pruned, and at most this many
    # rows are kept per key (0 = no limit).
    "RECONCILERS_HISTORY_DAYS": 14,
    "RECONCILERS_HISTORY_PER_KEY": 500,
    # Keys per enqueue statement when a relist or resync enqueues many at once.
    "RECONCILERS_ENQUEUE_BATCH": 1000,
    # Watch: server-side timeout range and client-side inactivity timeout (seconds).
    "RECONCILERS_WATCH_TIMEOUT_MIN": 300,
    "RECONCILERS_WATCH_TIMEOUT_MAX": 600,
    "RECONCILERS_WATCH_INACTIVITY": 90.0,
    "RECONCILERS_LIST_PAGE_SIZE": 500,
    # Leader election for watchers (coordination.k8s.io Lease).
    "RECONCILERS_LEADER_ELECTION": True,
    "RECONCILERS_LEASE_NAMESPACE": "default",
    "RECONCILERS_LEASE_NAME": "django-crd-operator-watcher",
    "RECONCILERS_LEADER_LEASE_SECONDS": 15,
    # Namespaces to watch ("" = all).
    "RECONCILERS_NAMESPACES": "",
    # Install/apply the CRDs of enabled reconcilers when the watcher starts.
    "RECONCILERS_APPLY_CRDS": False,
}

_ENV_FLOAT = {"RECONCILERS_LEASE_SECONDS", "RECONCILERS_MAX_COUNTDOWN",
              "RECONCILERS_REDISPATCH_AFTER", "RECONCILERS_REAPER_INTERVAL",
              "RECONCILERS_RESYNC_PERIOD", "RECONCILERS_BACKOFF_BASE", "RECONCILERS_BACKOFF_MAX",
              "RECONCILERS_WATCH_INACTIVITY"}
_ENV_INT = {"RECONCILERS_HISTORY_DAYS", "RECONCILERS_HISTORY_PER_KEY",
            "RECONCILERS_ENQUEUE_BATCH", "RECONCILERS_LEADER_LEASE_SECONDS"}


def get(name: str):
    """Django setting, else environment variable, else the default above."""
    if hasattr(django_settings, name):
        return getattr(django_settings, name)
    default = DEFAULTS[name]
    if name in _ENV_FLOAT:
        return env_float(name, float(default))  # type: ignore[arg-type]
    if name in _ENV_INT:
        return env_int(name, int(default))  # type: ignore[arg-type]
    import os

    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if isinstance(default, bool):
        return value.lower() in {"1", "true", "yes", "on"}
    return value


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


def default_backoff() -> Backoff:
    return Backoff(float(get("RECONCILERS_BACKOFF_BASE")), float(get("RECONCILERS_BACKOFF_MAX")))

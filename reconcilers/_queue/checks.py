"""System checks: catch misconfiguration at start-up, not at the first retry."""

from __future__ import annotations

import os
import re

from django.conf import settings as django_settings
from django.core.checks import Error, Warning, register

from reconcilers._queue import broker, ratelimit
from reconcilers._base.conf import settings
from reconcilers._authoring.registry import registry

# The tag of these checks: what ``manage.py watch`` runs before it starts (``--tag reconcilers``).
TAG = "reconcilers"


@register(TAG)
def check_retry_delays(app_configs, **kwargs):
    errors = []
    visibility = (getattr(django_settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}).get(
        "visibility_timeout", 3600)
    max_countdown = settings().max_countdown
    if max_countdown >= visibility:
        errors.append(Error(
            f"RECONCILERS_MAX_COUNTDOWN ({max_countdown:g}s) must be shorter than the broker's "
            f"visibility_timeout ({visibility}s)",
            hint="Redis redelivers a message whose countdown outlives the visibility timeout, "
                 "so it would run twice. Longer delays are kept in the ledger anyway.",
            id="reconcilers.E001"))
    lease = settings().lease_seconds
    if settings().redispatch_after < 1:
        errors.append(Error("RECONCILERS_REDISPATCH_AFTER must be at least 1 second",
                            id="reconcilers.E002"))
    if lease < 3:
        errors.append(Warning(
            f"RECONCILERS_LEASE_SECONDS={lease:g} is very short: a busy database may let leases "
            "expire mid-run and cause needless retries", id="reconcilers.W001"))
    return errors


def _database_engine() -> str:
    return django_settings.DATABASES.get("default", {}).get("ENGINE", "")


@register(TAG)
def check_services(app_configs, **kwargs):
    """What the app needs of the project it is installed in."""
    errors = []
    if not getattr(django_settings, "REDIS_URL", ""):
        errors.append(Error(
            "REDIS_URL is not set", hint="The shared object cache and the watch journal live "
            "in Redis: set REDIS_URL (for example the broker's URL, CELERY_BROKER_URL).",
            id="reconcilers.E003"))
    engine = _database_engine()
    if "postgresql" not in engine:
        errors.append(Error(
            f"the default database is {engine or 'not set'}, not PostgreSQL",
            hint="The work ledger relies on PostgreSQL (row locks, arrays, upserts).",
            id="reconcilers.E004"))
    return errors


# A server parameter in libpq's ``options`` (``-c name=value``, ``--name=value``): a bound on
# a statement is statement_timeout or lock_timeout, and 0 is none.
_SERVER_BOUND = re.compile(r"(?:-c\s*|--)(?:statement_timeout|lock_timeout)\s*=\s*([0-9.]+)")


def _positive(value) -> bool:
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return False


def _unbounded(database: dict) -> list[str]:
    """The waits on PostgreSQL this database entry leaves without a bound: OPTIONS are libpq's
    parameters, which its environment (``PGCONNECT_TIMEOUT``, ``PGOPTIONS``) stands in for."""
    options = database.get("OPTIONS") or {}
    missing = []
    if not _positive(options.get("connect_timeout", os.environ.get("PGCONNECT_TIMEOUT"))):
        missing.append("a connect (OPTIONS connect_timeout)")
    server = f"{options.get('options', '')} {os.environ.get('PGOPTIONS', '')}"
    if not any(_positive(v) for v in _SERVER_BOUND.findall(server)):
        missing.append("a statement (statement_timeout or lock_timeout in OPTIONS options, "
                       "e.g. '-c statement_timeout=60000')")
    host = str(database.get("HOST") or "")
    on_tcp = bool(host) and not host.startswith(("/", "@"))  # else a Unix socket
    if on_tcp and not (_positive(options.get("tcp_user_timeout"))
                       or _positive(options.get("keepalives_idle"))):
        missing.append("a server gone silent (OPTIONS tcp_user_timeout, or keepalives_idle)")
    return missing


def _ledger_databases() -> list[str]:
    """The ledger's statements run on the default database; the app's models (the admin,
    history) wherever the project's routers send them."""
    from django.db import router

    from reconcilers.models import WorkItem

    aliases = ["default", router.db_for_read(WorkItem), router.db_for_write(WorkItem)]
    return list(dict.fromkeys(a for a in aliases if a))


@register(TAG)
def check_database_timeouts(app_configs, **kwargs):
    """Every wait the ledger's database can hold a process in has a bound: without them a
    frozen or black-holed PostgreSQL holds a run, the reaper and a leader's step-down for
    ever, or for the kernel's TCP retransmission time (about 15 minutes)."""
    warnings = []
    for alias in _ledger_databases():
        database = django_settings.DATABASES.get(alias) or {}
        if "postgresql" not in database.get("ENGINE", ""):
            continue  # not PostgreSQL: reconcilers.E004 says what matters more
        missing = _unbounded(database)
        if missing:
            warnings.append(Warning(
                f"the database {alias!r} bounds no wait for {'; nor for '.join(missing)}",
                hint="A frozen or unreachable PostgreSQL would hold runs, the reaper and the "
                     "leader's step-down: set these in DATABASES[...]['OPTIONS'] (see "
                     "'Add it to your own Django project' in the docs). If the server or a "
                     "pooler sets them instead, silence this check: SILENCED_SYSTEM_CHECKS = "
                     "['reconcilers.W002'].",
                id="reconcilers.W002"))
    return warnings


@register(TAG)
def check_broker(app_configs, **kwargs):
    """The work queue publishes through the project's Celery app (``broker``): one must be
    loaded, or its messages would go to Celery's unconfigured fallback."""
    from django.core.exceptions import ImproperlyConfigured

    try:
        broker.app()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="reconcilers.E005")]
    return []


@register(TAG)
def check_metrics_pair(app_configs, **kwargs):
    """The secure ``/metrics``'s serving pair (``_base.tls``): a directory named must hold it,
    and a directory named while ``/metrics`` is plain would be silently unused."""
    from pathlib import Path

    from reconcilers._base import tls

    conf = settings()
    if not conf.metrics_cert_dir:
        return []
    if not conf.metrics_secure:
        return [Warning("RECONCILERS_METRICS_CERT_DIR is set but RECONCILERS_METRICS_SECURE is "
                        "off: /metrics is served plain and the pair is not used",
                        id="reconcilers.W003")]
    missing = [name for name in (tls.CERT, tls.KEY)
               if not (Path(conf.metrics_cert_dir) / name).is_file()]
    if missing:
        return [Error(f"RECONCILERS_METRICS_CERT_DIR={conf.metrics_cert_dir!r} holds no "
                      f"{' and no '.join(missing)}",
                      hint="Mount a kubernetes.io/tls Secret there, or leave the setting empty "
                           "for a self-signed pair made at start.", id="reconcilers.E006")]
    return []


@register(TAG)
def check_reconcilers(app_configs, **kwargs):
    errors = []
    for cls in registry:
        if not 1 <= int(cls.capability_level) <= 5:
            errors.append(Error(
                f"{cls.__qualname__}.capability_level must be 1-5 (the Operator SDK levels)",
                obj=cls, id="reconcilers.E010"))
        debounce = cls.debounce
        if (not isinstance(debounce, (int, float)) or isinstance(debounce, bool)
                or not 0 <= debounce <= settings().max_countdown):
            errors.append(Error(
                f"{cls.__qualname__}.debounce={debounce!r} must be a number of seconds from 0 "
                f"to RECONCILERS_MAX_COUNTDOWN ({settings().max_countdown:g})",
                obj=cls, id="reconcilers.E012"))
        for attr in ("rate_limit", "shared_rate_limit"):
            rate = getattr(cls, attr)
            if rate is None:
                continue
            try:
                ratelimit.per_second(rate)
            except ValueError:
                errors.append(Error(
                    f"{cls.__qualname__}.{attr}={rate!r} is not a Celery rate "
                    "(e.g. '10/s', '100/m')", obj=cls, id="reconcilers.E011"))
    return errors

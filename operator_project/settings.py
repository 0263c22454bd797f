"""Django settings, 12-factor: everything that differs between machines comes from the environment.

Local development gets safe defaults from ``.local/env`` (written by ``make up``); production must
set ``SECRET_KEY``, ``DATABASE_URL``, ``REDIS_URL`` and ``ALLOWED_HOSTS`` itself. The operator's
own settings (``RECONCILERS_*``) are listed with their defaults in docs/running/configuration.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from reconcilers.conf import (env_bool, env_float, env_int, env_list, load_env_file,
                              parse_database_url)

BASE_DIR = Path(__file__).resolve().parent.parent

load_env_file(Path(os.environ.get("OPERATOR_ENV_FILE", BASE_DIR / ".local" / "env")))

DEBUG = env_bool("DEBUG", False)

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "insecure-development-only-key"
if not DEBUG:
    # The placeholders of .env.example and deploy/secret.example.yaml never reach production.
    _placeholders = [name for name in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL",
                                       "DJANGO_SUPERUSER_PASSWORD")
                     if "change-me" in os.environ.get(name, "")]
    if _placeholders:
        raise ImproperlyConfigured(f"{', '.join(_placeholders)} still hold the 'change-me' "
                                   "placeholder: set real secrets (see .env.example)")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]" if DEBUG else "")

# The apps only the web role uses. OPERATOR_SERVES_PAGES=0 leaves them out of a process that
# serves no pages and runs no migrations (the watcher): it starts without the admin's imports.
# Every process runs with them unless told so: `migrate` without them would never make the
# admin's and the sessions' tables.
WEB_APPS = ["django.contrib.admin", "django.contrib.sessions", "django.contrib.messages",
            "django.contrib.staticfiles"]
SERVES_PAGES = env_bool("OPERATOR_SERVES_PAGES", True)
INSTALLED_APPS = [app for app in [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "reconcilers",
    "operator_project",
] if SERVES_PAGES or app not in WEB_APPS]

# The sample operators (kubernetes/sample-controller's Foo, the talk's ReplicaSet-like PodSet):
# on in development and tests
# (.local/env sets it), off by default in production.
OPERATOR_SAMPLES = env_bool("OPERATOR_SAMPLES", False)
if OPERATOR_SAMPLES:
    INSTALLED_APPS += ["reconcilers.contrib.samplecontroller", "reconcilers.contrib.podset"]
# Your operator apps, by import path, without editing this file: the image and compose take
# them from the environment (docs/running/compose.md, "Your apps in the image").
INSTALLED_APPS += env_list("OPERATOR_APPS")
# `makecrds` keeps the webhook server's cluster manifests (its read-only RBAC and the two
# configurations, which follow the resources' hooks) beside the CRDs; `--check` fails when stale.
RECONCILERS_WEBHOOK_MANIFESTS = os.environ.get(
    "RECONCILERS_WEBHOOK_MANIFESTS", str(BASE_DIR / "deploy" / "webhook" / "generated.yaml"))

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "operator_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "operator_project.wsgi.application"

_database_url = os.environ.get("DATABASE_URL", "")
if not _database_url:
    if not DEBUG:
        raise ImproperlyConfigured("DATABASE_URL must be set when DEBUG is off")
    _database_url = "postgres://operator:operator@127.0.0.1:15432/operator"
DATABASES = {"default": parse_database_url(
    _database_url, conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60), conn_health_checks=True)}


def _database_timeouts(options: dict) -> dict:
    """Bounds on every wait for PostgreSQL (libpq's parameters; the URL's query wins).

    Without them a black-holed database (packets dropped, its host gone) holds a run, the
    reaper and a leader's step-down for the kernel's retransmission time, about 15 minutes:
    ``connect_timeout`` bounds a connect, keepalives notice a silent peer of an idle
    connection and ``tcp_user_timeout`` one that stops acknowledging a statement, both in
    ``DATABASE_DEAD_PEER_TIMEOUT``; ``statement_timeout`` ends a statement stuck on the server
    (behind a lock). ``migrate`` may rewrite a large table: it gets its own bound, none unless
    ``DATABASE_MIGRATE_STATEMENT_TIMEOUT`` says, but waits for a lock no longer than a statement
    may run (``lock_timeout``) - a migration queued for a table's lock would hold every
    statement on that table queued behind it. A pooler that refuses the ``options`` startup
    parameter (PgBouncer) needs ``DATABASE_STATEMENT_TIMEOUT=0`` and the bound set on its side
    (and ``reconcilers.W002`` silenced: the system check cannot see it there).
    """
    dead_peer = env_float("DATABASE_DEAD_PEER_TIMEOUT", 30.0)
    statement = env_float("DATABASE_STATEMENT_TIMEOUT", 60.0)
    lock = 0.0
    if sys.argv[1:2] == ["migrate"]:  # manage.py migrate, django-admin migrate
        statement, lock = env_float("DATABASE_MIGRATE_STATEMENT_TIMEOUT", 0.0), statement
    bounded = {"connect_timeout": max(2, env_int("DATABASE_CONNECT_TIMEOUT", 5))}
    if dead_peer > 0:
        bounded.update(keepalives=1, keepalives_idle=max(1, round(dead_peer / 3)),
                       keepalives_interval=max(1, round(dead_peer / 6)), keepalives_count=4,
                       tcp_user_timeout=round(dead_peer * 1000))
    given = options.get("options", "")
    extra = " ".join(f"-c {name}={round(seconds * 1000)}"
                     for name, seconds in (("statement_timeout", statement), ("lock_timeout", lock))
                     if seconds > 0 and name not in given)
    if extra:
        bounded["options"] = f"{given} {extra}" if given else extra
    return {**options, **{k: v for k, v in bounded.items() if k == "options" or k not in options}}


DATABASES["default"]["OPTIONS"] = _database_timeouts(DATABASES["default"].get("OPTIONS", {}))

# The project's own migrations (admin roles) live in the top-level ``migrations/`` package; the
# reconcilers app carries its schema migrations inside itself, as in any other project.
MIGRATION_MODULES = {"operator_project": "migrations"}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# whitenoise serves the collected files from the web process itself (no separate file server in
# the container image). Hashed, compressed names in production; plain files in development, where
# nothing has been collected and runserver/whitenoise find them in the apps.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage" if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage",
    },
}
WHITENOISE_AUTOREFRESH = DEBUG

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0")

# --- Celery ---------------------------------------------------------------------------------
# Tasks carry keys, never objects; they are idempotent, so a message is acknowledged only after
# the run (acks_late) and given back when a worker dies mid-run (reject_on_worker_lost). The
# work ledger, not Celery, guarantees one run per key at a time.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fixup closes every database connection before and after each task unless
# this is set, so each reconcile would start a new PostgreSQL backend. The reconcilers app's
# tasks (runs and periodic ones) retire old and broken connections themselves
# (close_old_connections() before they use one), so CONN_MAX_AGE and health checks still apply
# to them; a project's own tasks in the same worker get no such check, which is why this is the
# project's choice, not the app's (Celery reads it before any app is loaded). 0: Celery's
# default, close around every task.
CELERY_DB_REUSE_MAX = env_int("CELERY_DB_REUSE_MAX", 1000)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
_broker_socket_timeout = env_float("CELERY_BROKER_SOCKET_TIMEOUT", 10.0)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # Seconds before Redis redelivers an unacknowledged message. Delays longer than this are
    # kept in the ledger and sent by beat when due, never as Redis countdowns.
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 3600),
    # kombu waits for Redis for ever by default: a broker gone without closing the connection
    # (failover, a NAT or firewall timeout, a proxy that lost the request) would hold a send -
    # a watcher's, a run's, the reaper's - for ever. Past these a send fails, the key stays
    # in the ledger and the reaper sends it again; the consumer reconnects.
    "socket_timeout": _broker_socket_timeout,
    "socket_connect_timeout": _broker_socket_timeout,
    "socket_keepalive": True,
}
CELERY_TIMEZONE = TIME_ZONE
# Beat's periodic tasks (reaper, resync, history pruning) are added by the reconcilers app
# itself, as it starts; an entry of the same name here would override it.

# LOG_FORMAT=json: one JSON object per line, each line of a run carrying its reconciler,
# namespace, name, trigger, attempt, task id and record id (reconcilers.conf.JsonFormatter).
LOG_FORMAT = os.environ.get("LOG_FORMAT", "plain")
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be 'plain' or 'json', not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "reconcilers.conf.JsonFormatter"},
    },
    "filters": {"run": {"()": "reconcilers.conf.RunFields"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT,
                    "filters": ["run"]},
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "kubernetes": {"level": "WARNING"},
        "urllib3": {"level": "WARNING"},
    },
}
# Celery logs through the configuration above (the same format, the run's fields) instead of
# replacing the root logger's handlers with its own.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False


# === Deployment: production hardening and health checks ======================================
# `python manage.py check --deploy` passes when DEBUG is off and ALLOWED_HOSTS is set. Behind a
# TLS-terminating proxy, declare it with SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https":
# the proxy then owns the HTTP->HTTPS redirect, so SECURE_SSL_REDIRECT defaults to off.
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

_proxy_ssl_header = env_list("SECURE_PROXY_SSL_HEADER")
if _proxy_ssl_header:
    if len(_proxy_ssl_header) != 2 or not _proxy_ssl_header[0].startswith("HTTP_"):
        raise ImproperlyConfigured(
            "SECURE_PROXY_SSL_HEADER must be 'HTTP_<HEADER>,<value>', "
            "e.g. 'HTTP_X_FORWARDED_PROTO,https'"
        )
    SECURE_PROXY_SSL_HEADER = (_proxy_ssl_header[0], _proxy_ssl_header[1])

SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG and not _proxy_ssl_header)
if _proxy_ssl_header and not SECURE_SSL_REDIRECT:
    # W008 asks for SECURE_SSL_REDIRECT; the declared proxy does the redirect instead.
    SILENCED_SYSTEM_CHECKS = [*globals().get("SILENCED_SYSTEM_CHECKS", []), "security.W008"]
# Probes (compose healthchecks, kubelet) speak plain HTTP to the process, not through the proxy.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]

SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)

# HSTS is remembered by browsers for SECURE_HSTS_SECONDS, so it is opt-in: start small (3600)
# and raise it once HTTPS is known to work everywhere.
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)

# Health checks (/readyz, `manage.py health`): seconds each readiness check may take, and how old
# the watcher's heartbeat may be before `manage.py health watcher` reports it unhealthy.
OPERATOR_HEALTH_TIMEOUT = env_float("OPERATOR_HEALTH_TIMEOUT", 3.0)
OPERATOR_HEALTH_WATCHER_MAX_AGE = env_float("OPERATOR_HEALTH_WATCHER_MAX_AGE", 30.0)
# /metrics, /healthz and /readyz of the processes that are not web servers (the watcher and
# the workers; docs/running/observability.md); 0 turns the endpoint off. The web role serves the same paths itself.
OPERATOR_WATCHER_HTTP_PORT = env_int("OPERATOR_WATCHER_HTTP_PORT", 8081)
OPERATOR_WORKER_HTTP_PORT = env_int("OPERATOR_WORKER_HTTP_PORT", 8082)
# /metrics over HTTPS, behind the api-server's TokenReview and SubjectAccessReview, while
# RECONCILERS_METRICS_SECURE is on (the ports above then answer /healthz and /readyz only).
OPERATOR_WATCHER_METRICS_PORT = env_int("OPERATOR_WATCHER_METRICS_PORT", 8443)
OPERATOR_WORKER_METRICS_PORT = env_int("OPERATOR_WORKER_METRICS_PORT", 8444)
# The address those ports listen on: every interface, as the kubelet probes the pod's address;
# 127.0.0.1 keeps them on the machine (a host network, a process outside a cluster).
OPERATOR_HTTP_HOST = os.environ.get("OPERATOR_HTTP_HOST", "0.0.0.0")
# Where the admin links a reconciler's metrics and a run's log lines: URL templates with
# {query} (PromQL / the log filter, URL-quoted) and {reconciler}, {namespace}, {name},
# {task_id}, {record_id}. Unset: the admin shows the query to paste.
OPERATOR_METRICS_URL = os.environ.get("OPERATOR_METRICS_URL", "")
OPERATOR_LOGS_URL = os.environ.get("OPERATOR_LOGS_URL", "")
# === End of deployment settings ================================================================

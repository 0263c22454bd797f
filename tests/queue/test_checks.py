"""System checks refuse settings that would break the ledger's guarantees."""

from __future__ import annotations

import pytest

from reconcilers._queue.checks import check_retry_delays


def test_a_countdown_longer_than_the_visibility_timeout_is_an_error(settings):
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 60}
    settings.RECONCILERS_MAX_COUNTDOWN = 300
    (error,) = check_retry_delays(None)
    assert error.id == "reconcilers.E001"


def test_default_delays_pass(settings):
    assert check_retry_delays(None) == []


def test_a_project_without_redis_or_postgresql_is_told_what_the_app_needs(settings,
                                                                           monkeypatch):
    from reconcilers._queue import checks
    from reconcilers._queue.checks import check_services

    assert check_services(None) == []
    del settings.REDIS_URL
    monkeypatch.setattr(checks, "_database_engine", lambda: "django.db.backends.sqlite3")
    assert [e.id for e in check_services(None)] == ["reconcilers.E003", "reconcilers.E004"]


def test_a_debounce_that_is_not_a_usable_delay_is_an_error(monkeypatch):
    from reconcilers._queue import checks
    from reconcilers._queue.checks import check_reconcilers
    from reconcilers._authoring.reconciler import Reconciler

    class Gathering(Reconciler):
        group, version, kind = "example.com", "v1", "Thing"
        debounce = 0.5

    class Negative(Gathering):
        kind = "Other"
        debounce = -1

    class Text(Gathering):
        kind = "Third"
        debounce = "1s"

    monkeypatch.setattr(checks, "registry", [Gathering, Negative, Text])
    errors = check_reconcilers(None)
    assert [(e.id, e.obj) for e in errors] == [("reconcilers.E012", Negative),
                                               ("reconcilers.E012", Text)]
    assert "from 0 to RECONCILERS_MAX_COUNTDOWN" in errors[0].msg


def test_the_watcher_refuses_to_start_on_a_failed_check():
    """From the command line the watcher runs the framework's checks (only those and the
    models', not the web role's) and exits with the check's message."""
    import os
    import subprocess
    import sys

    from django.conf import settings

    env = {**os.environ, "RECONCILERS_REDISPATCH_AFTER": "0",
           "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings")}
    proc = subprocess.run([sys.executable, "manage.py", "watch"], env=env, cwd=settings.BASE_DIR,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "reconcilers.E002" in proc.stderr and "RECONCILERS_REDISPATCH_AFTER" in proc.stderr


def test_a_rate_limit_that_is_not_a_celery_rate_is_refused(monkeypatch):
    from reconcilers._queue.checks import check_reconcilers
    from reconcilers._authoring.registry import registry

    cls = next(iter(registry))
    assert check_reconcilers(None) == []
    monkeypatch.setattr(cls, "shared_rate_limit", "ten a second")
    monkeypatch.setattr(cls, "rate_limit", "0/s")
    assert [e.id for e in check_reconcilers(None)] == ["reconcilers.E011"] * 2


# The checks read DATABASES as settings; no connection is made from the overridden entries.
_OVERRIDES_DATABASES = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


def _timeout_warnings(settings, **database) -> list:
    """The warnings about database timeouts a project with this default database gets."""
    from django.core.checks import run_checks

    settings.DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql",
                                      "NAME": "operator", "HOST": "db.example.com",
                                      **database}}
    return [w for w in run_checks(tags=["reconcilers"]) if w.id == "reconcilers.W002"]


@_OVERRIDES_DATABASES
def test_a_project_whose_database_has_no_timeouts_is_warned(settings, monkeypatch):
    """A user's project that forgets the timeouts the demo project sets lets a frozen or
    black-holed PostgreSQL hold a run, the reaper or a leader's step-down for ever (or for
    the kernel's 15 minutes): ``manage.py check`` says so, naming what is missing."""
    for name in ("PGCONNECT_TIMEOUT", "PGOPTIONS"):
        monkeypatch.delenv(name, raising=False)
    (warning,) = _timeout_warnings(settings)
    assert "'default'" in warning.msg
    for missing in ("connect_timeout", "statement_timeout", "lock_timeout", "tcp_user_timeout"):
        assert missing in warning.msg, warning.msg
    # A bound of 0 is none, in libpq as in PostgreSQL.
    (warning,) = _timeout_warnings(settings, OPTIONS={
        "connect_timeout": 0, "options": "-c statement_timeout=0", "tcp_user_timeout": 30000})
    assert "connect_timeout" in warning.msg and "statement_timeout" in warning.msg
    assert "tcp_user_timeout" not in warning.msg


@_OVERRIDES_DATABASES
def test_a_project_whose_database_bounds_every_wait_passes(settings, monkeypatch):
    for name in ("PGCONNECT_TIMEOUT", "PGOPTIONS"):
        monkeypatch.delenv(name, raising=False)
    assert _timeout_warnings(settings, OPTIONS={
        "connect_timeout": 5, "tcp_user_timeout": 30000,
        "options": "-c statement_timeout=60000"}) == []
    assert _timeout_warnings(settings, OPTIONS={  # a lock bound alone will do, keepalives too
        "connect_timeout": "5", "keepalives_idle": 10, "options": "--lock_timeout=10s"}) == []
    # libpq's environment counts as well, and a Unix socket has no silent peer to notice.
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "5")
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=10s")
    assert _timeout_warnings(settings, HOST="/var/run/postgresql") == []


@_OVERRIDES_DATABASES
def test_a_database_the_ledgers_models_are_routed_to_is_checked_too(settings, monkeypatch):
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    monkeypatch.delenv("PGOPTIONS", raising=False)
    bounded = {"ENGINE": "django.db.backends.postgresql", "NAME": "operator",
               "HOST": "db.example.com", "OPTIONS": {
                   "connect_timeout": 5, "tcp_user_timeout": 30000,
                   "options": "-c statement_timeout=60000"}}
    settings.DATABASES = {"default": bounded, "ledger": {**bounded, "OPTIONS": {}}}
    settings.DATABASE_ROUTERS = ["tests.queue.test_checks.LedgerRouter"]
    from django.core.checks import run_checks

    warnings = [w for w in run_checks(tags=["reconcilers"]) if w.id == "reconcilers.W002"]
    assert [("'ledger'" in w.msg) for w in warnings] == [True]


class LedgerRouter:
    """Sends the reconcilers app's tables to a database of their own."""

    def db_for_read(self, model, **hints):
        return "ledger" if model._meta.app_label == "reconcilers" else None

    db_for_write = db_for_read


@pytest.mark.parametrize("module", ["operator_project.settings", "tests.settings",
                                    "tests.routedproject.settings"])
@pytest.mark.parametrize("argv", [["manage.py", "check"], ["manage.py", "migrate"]])
def test_the_projects_own_settings_bound_every_wait(module, argv):
    """The demo project's settings (and the tests' built on them) pass, ``migrate`` too: it
    has no statement bound (a migration may rewrite a large table) but waits for a lock no
    longer than a statement may run."""
    import os
    import subprocess
    import sys

    from django.conf import settings

    code = (f"import sys; sys.argv = {argv!r}\n"
            "import django; django.setup()\n"
            "from django.core.checks import run_checks\n"
            "print([w.id for w in run_checks(tags=['reconcilers'])])\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PGCONNECT_TIMEOUT", "PGOPTIONS")}
    env["DJANGO_SETTINGS_MODULE"] = module
    proc = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "reconcilers.W002" not in proc.stdout, proc.stdout
def test_a_metrics_cert_dir_without_its_pair_is_an_error(settings, tmp_path):
    from reconcilers._base import tls
    from reconcilers._queue.checks import check_metrics_pair

    assert check_metrics_pair(None) == []
    settings.RECONCILERS_METRICS_CERT_DIR = str(tmp_path)
    assert [e.id for e in check_metrics_pair(None)] == ["reconcilers.W003"]  # plain: unused
    settings.RECONCILERS_METRICS_SECURE = True
    (error,) = check_metrics_pair(None)
    assert error.id == "reconcilers.E006" and "tls.crt and no tls.key" in error.msg
    cert, key = tls.self_signed(["localhost"])
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    assert check_metrics_pair(None) == []

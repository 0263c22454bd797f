"""System checks refuse settings that would break the ledger's guarantees."""

from __future__ import annotations

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


def test_a_metrics_cert_dir_without_its_pair_is_an_error(settings, tmp_path):
    from reconcilers._base import tls
    from reconcilers._queue.checks import check_metrics_pair

    assert check_metrics_pair(None) == []
    settings.RECONCILERS_METRICS_CERT_DIR = str(tmp_path)
    assert [e.id for e in check_metrics_pair(None)] == ["reconcilers.W002"]  # plain: unused
    settings.RECONCILERS_METRICS_SECURE = True
    (error,) = check_metrics_pair(None)
    assert error.id == "reconcilers.E006" and "tls.crt and no tls.key" in error.msg
    cert, key = tls.self_signed(["localhost"])
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    assert check_metrics_pair(None) == []

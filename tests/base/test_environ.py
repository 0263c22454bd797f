"""12-factor settings parsing: a wrong value fails at start-up with a message naming it."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from reconcilers._base.environ import env_bool, load_env_file, parse_database_url


def test_database_url_becomes_a_postgresql_database_entry():
    db = parse_database_url("postgres://op%40x:p%2Fw@db.example:6543/ledger?sslmode=require")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "op@x", "p/w", "db.example", 6543, "ledger")
    assert db["OPTIONS"] == {"sslmode": "require"}


def test_database_url_query_options_reach_the_driver_typed():
    db = parse_database_url("postgresql://u:p@h/ledger?sslmode=verify-full&sslrootcert=/ca.pem"
                            "&connect_timeout=5&pool=true&application_name=watcher")
    assert db["OPTIONS"] == {"sslmode": "verify-full", "sslrootcert": "/ca.pem",
                             "connect_timeout": 5, "pool": True, "application_name": "watcher"}


def test_database_url_host_may_be_a_unix_socket_directory():
    db = parse_database_url("postgres://operator@%2Fvar%2Frun%2Fpostgresql/ledger")
    assert (db["HOST"], db["PORT"], db["USER"], db["NAME"]) == (
        "/var/run/postgresql", "", "operator", "ledger")


def test_database_url_may_name_a_service_instead_of_a_database():
    """pg_service.conf holds host, database and credentials; the URL only names the entry."""
    db = parse_database_url("postgres:///?service=ledger")
    assert db["OPTIONS"] == {"service": "ledger"} and db["NAME"] == ""


def test_database_url_connection_settings_are_applied():
    db = parse_database_url("postgres://h/ledger", conn_max_age=60, conn_health_checks=True)
    assert (db["CONN_MAX_AGE"], db["CONN_HEALTH_CHECKS"]) == (60, True)


@pytest.mark.parametrize("url, message", [
    ("sqlite:///db.sqlite3", "needs PostgreSQL"),
    ("mysql://u:p@h/db", "needs PostgreSQL"),
    ("postgis://u:p@h/db", "needs PostgreSQL"),
    ("postgres://h:1/", "names no database"),
    ("redis://h/0", "DATABASE_URL"),
    ("postgres://h:notaport/db", "DATABASE_URL"),
])
def test_database_url_that_is_not_postgresql_with_a_name_is_refused(url, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_database_url(url)


def test_boolean_variables_reject_typos(monkeypatch):
    monkeypatch.setenv("X_FLAG", "ture")
    with pytest.raises(ImproperlyConfigured, match="X_FLAG"):
        env_bool("X_FLAG")
    monkeypatch.setenv("X_FLAG", "on")
    assert env_bool("X_FLAG") is True


def test_env_file_never_overrides_the_real_environment(tmp_path, monkeypatch):
    f = tmp_path / "env"
    f.write_text("# comment\nX_ONE=from-file\nX_TWO=from-file\n")
    monkeypatch.setenv("X_ONE", "from-environment")
    monkeypatch.delenv("X_TWO", raising=False)
    load_env_file(f)
    import os

    assert os.environ["X_ONE"] == "from-environment"
    assert os.environ["X_TWO"] == "from-file"
    monkeypatch.delenv("X_TWO")

"""12-factor settings parsing: a wrong value fails at start-up with a message naming it."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from reconcilers.environ import env_bool, load_env_file, parse_database_url


def test_database_url_becomes_a_postgresql_database_entry():
    db = parse_database_url("postgres://op%40x:p%2Fw@db.example:6543/ledger?sslmode=require")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "op@x", "p/w", "db.example", "6543", "ledger")
    assert db["OPTIONS"] == {"sslmode": "require"}


@pytest.mark.parametrize("url", ["sqlite:///db.sqlite3", "mysql://u:p@h/db", "postgres://h:1/"])
def test_database_url_that_is_not_postgresql_with_a_name_is_refused(url):
    with pytest.raises(ImproperlyConfigured):
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

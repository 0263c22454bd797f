"""Reading 12-factor settings from the environment (the project's settings and ``conf``).

``load_env_file`` fills in variables from ``.local/env`` (written by ``make up``) without
overriding anything already set, so ``python manage.py ...`` works right after ``make up`` while
a real deployment's environment always wins. ``parse_database_url`` is dj-database-url's parser
plus the one rule it cannot know: the work ledger needs PostgreSQL and a database to use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured


def load_env_file(path: Path) -> None:
    if not path.is_file():
        return
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        os.environ.setdefault(name.strip(), value.strip())


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def parse_bool(name: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use 1/0, true/false)")


def parse_int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None


def parse_float(name: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    return default if value is None or value == "" else parse_bool(name, value)


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None or value == "" else parse_int(name, value)


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return default if value is None or value == "" else parse_float(name, value)


def parse_database_url(url: str, **options: Any) -> dj_database_url.DBConfig:
    """A ``DATABASES`` entry from ``DATABASE_URL``, by ``dj_database_url.parse`` (``options``
    are its keyword arguments, e.g. ``conn_max_age``). What it reads: percent-encoded user,
    password and name; a Unix socket directory as the host (``postgres://%2Fvar%2Frun%2F
    postgresql/ledger``); the query as ``OPTIONS`` (``?sslmode=require``, ``?pool=true``,
    ``?service=...``; digits become integers, ``true``/``false`` booleans). Refused here, at
    start-up and naming the variable: a URL it cannot parse, a database other than PostgreSQL,
    and one that names no database (no path and no ``service``)."""
    try:
        db = dj_database_url.parse(url, **options)
    except ValueError as exc:  # UnknownSchemeError, ParseError
        raise ImproperlyConfigured(f"DATABASE_URL: {exc}") from None
    if db["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured(
            f"DATABASE_URL must be a postgres:// URL (the work ledger needs PostgreSQL), "
            f"got scheme {url.partition(':')[0]!r}"
        )
    if not db.get("NAME") and "service" not in db.get("OPTIONS", {}):
        raise ImproperlyConfigured("DATABASE_URL names no database")
    return db

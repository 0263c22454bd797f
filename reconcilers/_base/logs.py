"""Log lines that join the admin's history: every line logged during a run carries its key.

The runner binds ``reconciler``, ``namespace``, ``name``, ``trigger``, ``attempt`` and
``task_id`` for the length of a run (``bound``), and ``record_id`` once the run is recorded;
``RunFields`` attaches them to every log record of that thread - the user's ``ctx.log``, the
Kubernetes client's, the project's own. ``JsonFormatter`` (python-json-logger's, with the run's
fields) writes one JSON object per line (``LOG_FORMAT=json``), for Loki, Elasticsearch or Cloud
Logging to index; plain text stays the default for people reading a terminal.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from datetime import datetime, timezone
from typing import Any, Iterator

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as LibraryJsonFormatter

FIELDS = ("reconciler", "namespace", "name", "trigger", "attempt", "task_id", "record_id")

# The run a line is logged during: each thread and task sees its own value (``bind``); the
# variable itself is module level, as every context variable must be.
_run: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("operator_run",
                                                                      default={})


@contextlib.contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Every log line inside the block carries ``fields`` (nested blocks add to them)."""
    token = _run.set({**_run.get(), **fields})
    try:
        yield
    finally:
        _run.reset(token)


def bind(**fields: Any) -> None:
    """Add fields to the current block (the record id, known only at the run's end)."""
    _run.set({**_run.get(), **fields})


class RunFields(logging.Filter):
    """Puts the current run's fields on each record, as ``record.run`` (a dict: ``name``, the
    object's, would clash with the record's own ``name``, the logger's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _run.get()
        if fields and not hasattr(record, "run"):
            record.run = fields
        return True


class JsonFormatter(LibraryJsonFormatter):
    """python-json-logger's formatter, one object per line: ``time`` (UTC, milliseconds),
    ``level``, ``logger``, ``message``, ``process``, the run's fields at the top level (``name``
    is the object's), any ``extra=`` the caller passed (its own JSON type where it has one,
    else its ``str``) and the ``exception``'s traceback. Keyword arguments are the library's
    (``static_fields``, ``rename_fields``, ...), for a ``LOGGING`` entry to adjust."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not args:
            kwargs.setdefault("fmt", "%(asctime)s %(levelname)s %(name)s %(message)s %(process)s")
        kwargs.setdefault("rename_fields", {"asctime": "time", "levelname": "level",
                                            "name": "logger", "exc_info": "exception"})
        # ``run`` is RunFields' dict: its fields go on the line itself, not under "run".
        kwargs.setdefault("reserved_attrs", [*RESERVED_ATTRS, "run"])
        kwargs.setdefault("json_ensure_ascii", False)
        super().__init__(*args, **kwargs)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt:
            return super().formatTime(record, datefmt)
        return (datetime.fromtimestamp(record.created, timezone.utc)
                .isoformat(timespec="milliseconds").replace("+00:00", "Z"))

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord,
                   message_dict: dict[str, Any]) -> None:
        super().add_fields(log_data, record, message_dict)
        level = self.rename_fields.get("levelname", "levelname")
        if isinstance(log_data.get(level), str):
            log_data[level] = log_data[level].lower()
        # The caller's extra= wins over a run field of the same name, as a later bind would.
        for key, value in getattr(record, "run", {}).items():
            log_data.setdefault(key, value)

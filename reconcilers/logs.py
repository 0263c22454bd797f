"""Log lines that join the admin's history: every line logged during a run carries its key.

The runner binds ``reconciler``, ``namespace``, ``name``, ``trigger``, ``attempt`` and
``task_id`` for the length of a run (``bound``), and ``record_id`` once the run is recorded;
``RunFields`` attaches them to every log record of that thread - the user's ``ctx.log``, the
Kubernetes client's, the project's own. ``JsonFormatter`` writes one JSON object per line
(``LOG_FORMAT=json``), for Loki, Elasticsearch or Cloud Logging to index; plain text stays the
default for people reading a terminal.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from datetime import datetime, timezone
from typing import Any, Iterator

FIELDS = ("reconciler", "namespace", "name", "trigger", "attempt", "task_id", "record_id")

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


_RESERVED = (set(vars(logging.LogRecord("", 0, "", 0, "", None, None)))
             | {"message", "asctime", "run"})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the run's fields (``name`` is
    the object's), any ``extra=`` the caller passed, and the traceback of an exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            **getattr(record, "run", {}),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                line[key] = value if isinstance(value, (str, int, float, bool)) or value is None \
                    else str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)

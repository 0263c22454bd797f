"""Log lines of a run carry its key and ids; LOG_FORMAT=json writes one object per line."""

from __future__ import annotations

import io
import json
import logging

from reconcilers._base import logs


def _logger() -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(logs.RunFields())
    logger = logging.getLogger("test.logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, out


def test_every_line_inside_a_run_carries_its_fields_and_none_after():
    logger, out = _logger()
    with logs.bound(reconciler="foos.example.com", namespace="ns", name="a", attempt=2,
                    trigger="modified", task_id="foos.example.com:ns/a#7"):
        logger.info("inside %s", "the run")
        logs.bind(record_id=41)
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    logger.info("after", extra={"custom": {"x": 1}})

    inside, failed, after = [json.loads(line) for line in out.getvalue().splitlines()]
    assert inside["message"] == "inside the run" and inside["level"] == "info"
    assert {k: inside[k] for k in ("reconciler", "namespace", "name", "attempt", "trigger",
                                   "task_id")} == {
        "reconciler": "foos.example.com", "namespace": "ns", "name": "a", "attempt": 2,
        "trigger": "modified", "task_id": "foos.example.com:ns/a#7"}
    assert "record_id" not in inside
    assert failed["record_id"] == 41 and "ValueError: boom" in failed["exception"]
    assert "reconciler" not in after and after["custom"] == {"x": 1}
    assert after["time"].endswith("Z") and after["logger"] == "test.logs"
    assert set(inside) == {"time", "level", "logger", "message", "process", "reconciler",
                           "namespace", "name", "attempt", "trigger", "task_id"}


def test_a_value_json_cannot_hold_is_written_as_its_string():
    logger, out = _logger()
    logger.warning("odd", extra={"path": __import__("pathlib").Path("/x"), "n": None})
    line = json.loads(out.getvalue())
    assert (line["path"], line["n"], line["level"]) == ("/x", None, "warning")


def test_the_callers_extra_wins_over_a_run_field_and_the_record_over_both():
    logger, out = _logger()
    with logs.bound(reconciler="r", namespace="ns", message="not the message"):
        logger.info("the message", extra={"namespace": "from-extra"})
    line = json.loads(out.getvalue())
    assert (line["reconciler"], line["namespace"], line["message"]) == (
        "r", "from-extra", "the message")


def test_the_formatter_takes_the_librarys_options_in_logging_config():
    """A project's LOGGING can pass python-json-logger's own options to it."""
    import logging.config

    formatter = logging.config.DictConfigurator({}).configure_formatter(
        {"()": "reconcilers._base.logs.JsonFormatter", "static_fields": {"service": "operator"}})
    logger, out = _logger()
    logger.handlers[0].setFormatter(formatter)
    logger.error("x")
    line = json.loads(out.getvalue())
    assert (line["service"], line["level"], line["logger"]) == ("operator", "error", "test.logs")


def test_log_format_is_checked(monkeypatch):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**__import__("os").environ, "LOG_FORMAT": "xml",
             "DJANGO_SETTINGS_MODULE": "operator_project.settings", "DEBUG": "1"},
        capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "LOG_FORMAT must be 'plain' or 'json'" in result.stderr

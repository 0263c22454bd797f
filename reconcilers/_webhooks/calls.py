"""Each admission call recorded as a ``WebhookCall`` row, off the answer's path.

The rule: ``record(outcome)`` only queues it; one daemon thread per process writes the rows
in batches over its own database connection. A full queue drops a record, and a database
error loses a batch, each logged. Why: admission sits on the api-server's write path with a
timeout of seconds, so a slow or absent database may cost records, never an answer. The
thread starts at the first call, so under gunicorn it runs in the worker that answers, not
in the master that forked it.
"""

from __future__ import annotations

import logging
import queue
import threading

from django.db import close_old_connections, connection

from reconcilers._webhooks import admission
from reconcilers.models import WebhookCall

log = logging.getLogger(__name__)


class _Recorder(threading.Thread):
    """Writes ``WebhookCall`` rows in batches from one thread with one database connection,
    off the path of the answer. A database outage loses records (logged), never admission."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="webhook-recorder")
        self.queue: queue.Queue[admission.Answer] = queue.Queue(maxsize=10_000)

    def put(self, outcome: admission.Answer) -> None:
        try:
            self.queue.put_nowait(outcome)
        except queue.Full:
            log.warning("webhook call records are backing up; dropping one")

    def run(self) -> None:
        while True:
            batch = [self.queue.get()]
            while len(batch) < 500:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            try:
                close_old_connections()
                WebhookCall.objects.bulk_create([WebhookCall(
                    resource=o.resource, namespace=o.namespace, name=o.name,
                    operation=o.operation, hook=o.hook, allowed=o.allowed,
                    message=o.message[:4000], dry_run=o.dry_run, duration_ms=o.seconds * 1000)
                    for o in batch])
            except Exception as exc:
                log.warning("could not record %d webhook calls: %s", len(batch), exc)
                connection.close()


_recorder: _Recorder | None = None  # this process's one writer, started by its first call
_recorder_lock = threading.Lock()


def record(outcome: admission.Answer) -> None:
    """Queue ``outcome``'s row for the writer; never blocks on the database."""
    global _recorder
    with _recorder_lock:
        if _recorder is None:
            _recorder = _Recorder()
            _recorder.start()
    _recorder.put(outcome)

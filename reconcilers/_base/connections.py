"""A long-lived thread's database connection, kept sound at the price of one check a second.

Django retires old and broken connections at the edges of a request (``close_old_connections``)
and, with ``CONN_HEALTH_CHECKS``, asks the next cursor to run ``SELECT 1`` first. The
operator's threads - a worker's run threads, the watcher's enqueuer - have no requests: they
issue a statement per key or per batch, and a check before each would double the round trips.
So each thread checks at most once a second (at once when its connection is suspect: an error
on it, or a transaction left open), and a statement that finds the connection dropped since
(a database restart, a failover) runs once more on a new one (``once_more_on_new``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable, TypeVar

from django.db import InterfaceError, OperationalError, close_old_connections, connection

log = logging.getLogger(__name__)

T = TypeVar("T")

CHECK_EVERY = 1.0  # seconds between two checks of one thread's connection

# When each thread last checked its connection: written and read by that thread alone (a
# thread-local), since each thread has its own connection.
_checked = threading.local()


def check_now_and_then() -> None:
    """Retire this thread's connection if it is old or broken - at most once every
    ``CHECK_EVERY`` seconds, or at once when it is suspect."""
    now = time.monotonic()
    suspect = connection.connection is not None and (
        connection.errors_occurred or not connection.get_autocommit())
    if suspect or now - getattr(_checked, "at", -math.inf) >= CHECK_EVERY:
        close_old_connections()
        _checked.at = now


def forget_last_check() -> None:
    """The next ``check_now_and_then`` checks, however recent the last one."""
    _checked.at = -math.inf


def once_more_on_new(statement: Callable[[], T], subject: object, what: str) -> T:
    """Run ``statement`` after ``check_now_and_then``; if the connection turns out broken
    (dropped since the last check), run it once more on a new one. ``statement`` must be one
    that a failed attempt left undone (it ran in a transaction that did not commit).
    ``subject: what`` names it in the log, formatted only then (this runs once per key)."""
    check_now_and_then()
    try:
        return statement()
    except (OperationalError, InterfaceError) as exc:
        log.warning("%s: %s failed on a broken database connection (%s); retrying on a new "
                    "one", subject, what, exc)
        connection.close()
        return statement()

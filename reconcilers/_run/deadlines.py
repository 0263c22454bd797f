"""Run deadlines where the worker pool cannot enforce them: Celery's thread pool.

The prefork pool enforces ``RunLimits`` itself (a signal at the soft limit, the child process
ended at the hard one). In the thread pool - the default layout, one light process for many
runs - this module does it: one watchdog thread per process raises the soft-limit exception
in the run's own thread (between two Python instructions, as a signal would). A thread blocked
inside C (a ``time.sleep``, a socket read without a timeout) only sees that exception when it
returns to Python, so such a run can still be going at the hard limit. It is then abandoned,
not fatal to its neighbours: the run's ``abandon`` (``runner``) records it as an error, releases
its key for a retry with backoff and fences its writes, and the run pool replaces its thread,
which is left to finish on its own. Only when more than ``RECONCILERS_ABANDONED_RUNS_MAX``
abandoned threads are still stuck does the process drain (a warm shutdown: it stops taking
messages and lets the runs in flight finish) and exit - a process full of stuck threads is
better restarted. A run that offers no ``abandon`` still ends the process, as prefork ends its
child; the runs that process held are retried once their leases expire.
In the main thread (a prefork child, the solo pool, tests calling the runner) ``guard`` does
nothing: there the pool, or nobody, enforces the deadline - except for a message carrying
several keys (``everywhere``), whose keys each keep their own deadline.
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

log = logging.getLogger(__name__)

# The exit status of a worker process ended because a run ignored its deadline.
EXIT_DEADLINE = 70
TICK = 0.05
# Past the hard limit, well inside the lease (hard + 2 s): the backstop for a GIL held in C.
BACKSTOP = 0.5


@dataclass
class _Run:
    label: str
    soft_at: float
    hard_at: float
    abandon: Callable[[], None] | None = None
    interrupt: type[BaseException] = TimeoutError
    signalled: bool = False
    abandoned: bool = False


# The runs being held to their deadlines, by thread id: added and removed by each run's own
# thread, read by the one watchdog thread (started by the first run, ``_ensure_watchdog``),
# all under ``_lock``. Module level because the watchdog serves every run of the process.
_runs: dict[int, _Run] = {}
_lock = threading.Lock()
_watchdog: threading.Thread | None = None
# What the soft limit raises unless the caller names its own: the worker names Celery's
# SoftTimeLimitExceeded (``guard``'s ``interrupt``), so a reconciler catches the same
# exception in either pool while this module needs no Celery.
SOFT_LIMIT_ERROR: type[BaseException] = TimeoutError


def _raise_in(ident: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                               ctypes.py_object(exc) if exc else None)


# Whether the calling thread's run is guarded everywhere (``guarded``): each thread its own.
_local = threading.local()


@contextmanager
def everywhere() -> Iterator[None]:
    """Inside, ``guard`` holds the main thread too: a prefork child running a message of
    several keys, where the pool's own limit is per message, not per key."""
    _local.everywhere = True
    try:
        yield
    finally:
        _local.everywhere = False


@contextmanager
def guard(label: str, soft: float, hard: float, abandon: Callable[[], None] | None = None,
          interrupt: type[BaseException] = SOFT_LIMIT_ERROR) -> Iterator[None]:
    """Hold the calling thread to ``soft``/``hard`` seconds from now (pool threads only,
    unless inside ``everywhere``): at ``soft`` ``interrupt`` is raised in it. At ``hard``,
    ``abandon`` is called in a thread of its own when given (the calling thread is then left
    to itself), else the process ends."""
    if (threading.current_thread() is threading.main_thread()
            and not getattr(_local, "everywhere", False)):
        yield
        return
    ident, now = threading.get_ident(), time.monotonic()
    run = _Run(label, now + soft, now + hard, abandon, interrupt)
    backstop = threading.current_thread() is threading.main_thread() and _backstop(hard)
    with _lock:
        _runs[ident] = run
        _ensure_watchdog()
    try:
        yield
    finally:
        if backstop:
            faulthandler.cancel_dump_traceback_later()
        with _lock:
            _runs.pop(ident, None)
            if run.signalled:
                _raise_in(ident, None)  # one raised too late to land is cancelled


def _backstop(hard: float) -> bool:
    """The pool's own kill comes only after the whole message: should user code hold the GIL
    in C past the hard limit (the watchdog needs it), a C timer ends the process. It writes
    to the process's real stderr: a Celery worker's ``sys.stderr`` is a logging proxy."""
    try:
        faulthandler.dump_traceback_later(hard + BACKSTOP, exit=True,
                                          file=sys.__stderr__ or sys.stderr)
        return True
    except Exception as exc:  # noqa: BLE001 - no usable stderr: the watchdog alone, as before
        log.debug("no faulthandler backstop for the run deadline: %s", exc)
        return False


def _ensure_watchdog() -> None:
    global _watchdog
    if _watchdog is None or not _watchdog.is_alive():
        _watchdog = threading.Thread(target=_watch, name="run-deadlines", daemon=True)
        _watchdog.start()


def _watch() -> None:
    while True:
        time.sleep(TICK)
        now = time.monotonic()
        with _lock:
            for ident, run in _runs.items():
                if now >= run.hard_at and not run.abandoned:
                    if run.abandon is None:
                        _end_process(run)
                    run.abandoned = True
                    threading.Thread(target=run.abandon, name=f"abandon:{run.label}",
                                     daemon=True).start()
                if not run.signalled and now >= run.soft_at:
                    run.signalled = True
                    _raise_in(ident, run.interrupt)


def drain_and_exit(reason: str) -> None:
    """A warm shutdown of this worker (Celery's answer to SIGTERM: stop consuming, let the runs
    in flight finish, exit), for a process too full of stuck threads to be worth keeping."""
    import signal

    log.critical("%s: draining worker process %d and exiting (its supervisor restarts it)",
                 reason, os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)


def _end_process(run: _Run) -> None:
    log.critical("%s ignored its run deadline: ending worker process %d (as prefork ends its "
                 "child); every run it held is retried once its lease expires", run.label,
                 os.getpid())
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - nothing may stop the exit
            pass
    try:  # where the run was stuck (and every other thread), for whoever reads the log
        faulthandler.dump_traceback(file=sys.__stderr__ or sys.stderr, all_threads=True)
    except Exception:  # noqa: BLE001 - nothing may stop the exit
        pass
    sys.stderr.flush()
    os._exit(EXIT_DEADLINE)

"""How a worker process shares itself among the keys of a message that carries several.

A message may carry several keys of one reconciler (``RECONCILERS_KEYS_PER_MESSAGE``): one
delivery and one ack for all of them. Each key is still claimed, run and recorded on its own,
as if it had a message of its own; this module only decides where those runs happen:

- In Celery's thread pool (``configure`` was called with its concurrency) they run at once on
  the process's run threads - a message of one key too (``on_run_thread``), so Celery's own
  threads only wait and never hold a database connection - and every run holds one of
  ``size`` slots: a process never runs more keys at once than its concurrency, however its
  messages were packed.
- Where the pool runs tasks in the main thread (a prefork child, the solo pool) they run one
  after another, each under its own deadline (``deadlines.everywhere``): the pool's own limit
  is per message.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator, Sequence, TypeVar

from . import deadlines

T = TypeVar("T")
R = TypeVar("R")

_slots: threading.BoundedSemaphore | None = None
_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def configure(size: int) -> None:
    """This process runs at most ``size`` keys at once, on as many run threads."""
    global _slots, _executor
    with _lock:
        _slots = threading.BoundedSemaphore(max(1, size))
        old, _executor = _executor, ThreadPoolExecutor(max(1, size), thread_name_prefix="run")
    if old is not None:
        old.shutdown(wait=False)


def configured() -> bool:
    """Whether this process runs keys on run threads (a thread-pool worker)."""
    return _executor is not None


@contextmanager
def slot() -> Iterator[None]:
    """Held for the whole of one run (claim to record)."""
    slots = _slots
    with slots if slots is not None else nullcontext():
        yield


def on_run_thread(fn: Callable[[], R]) -> R:
    """``fn()`` on a run thread where this process has them (a message of one key, as the keys
    of one carrying several), so only run threads ever hold a database connection: a thread-
    pool worker holds at most its concurrency, not twice that. Elsewhere, here and now."""
    executor = _executor
    if executor is None or threading.current_thread() is threading.main_thread():
        return fn()
    return executor.submit(fn).result()


def run_all(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn`` over ``items`` as this process runs keys; results in order. Every item runs
    even when an earlier one raised; the first exception is raised at the end."""
    executor = _executor
    if threading.current_thread() is threading.main_thread() or executor is None:
        with deadlines.everywhere():
            outcomes = [_outcome(fn, item) for item in items]
    else:
        outcomes = [f.result() for f in [executor.submit(_outcome, fn, item) for item in items]]
    for _, error in outcomes:
        if error is not None:
            raise error
    return [result for result, _ in outcomes]  # type: ignore[misc]


def _outcome(fn: Callable[[T], R], item: T) -> tuple[R | None, BaseException | None]:
    try:
        return fn(item), None
    except Exception as exc:  # the other keys of the message still run
        return None, exc

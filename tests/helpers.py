"""Small helpers shared by tests: waiting for a condition, reading history."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

REPO = Path(__file__).resolve().parent.parent

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 30, what: str = "condition",
             interval: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except AssertionError as e:
            last_error = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                         + (f": {last_error}" if last_error else ""))


def made_together(make: Callable[..., T], threads: int) -> tuple[Callable[..., T], list[int]]:
    """``make`` slowed down so that callers who each make their own all make it at once: every
    call waits (up to 5 s) until ``threads`` calls are inside. Returns it and its call count
    (a list, one entry per call)."""
    made: list[int] = []
    all_inside = threading.Barrier(threads, timeout=5)

    def slow(*args, **kwargs) -> T:
        made.append(1)
        try:
            all_inside.wait()
        except threading.BrokenBarrierError:  # only one made it: the others never came in
            pass
        return make(*args, **kwargs)

    return slow, made


def in_threads(fn: Callable[[], T], threads: int) -> list[T | Exception]:
    """``fn()`` in ``threads`` threads started together; what each returned or raised."""
    out: list[T | Exception] = []

    def call() -> None:
        try:
            out.append(fn())
        except Exception as exc:
            out.append(exc)

    workers = [threading.Thread(target=call) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(10)
    return out

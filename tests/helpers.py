"""Small helpers shared by tests: waiting for a condition, reading history."""

from __future__ import annotations

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

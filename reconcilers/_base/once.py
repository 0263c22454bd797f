"""Objects a process makes once and keeps: its Redis client, its Kubernetes client.

``functools.lru_cache`` is not enough for them: threads asking at the same moment (a thread-pool
worker's first runs start together) each make one, and all but the last are replaced in the
memo and dropped. A dropped redis-py client made by ``from_url`` closes its connection pool -
connections still in use by another thread's pipeline included - so that thread's read fails
on a closed buffer or hangs. Here the first caller makes it under a lock and the others wait.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Callable, Generic, Hashable, TypeVar

T = TypeVar("T")


class per_process(Generic[T]):  # noqa: N801 - used as a decorator, named like one
    """``make(*args)`` once per distinct ``args`` (hashable); every caller gets that one."""

    def __init__(self, make: Callable[..., T]) -> None:
        self.make = make
        self.made: dict[tuple[Hashable, ...], T] = {}
        self.lock = threading.Lock()
        functools.update_wrapper(self, make)
        # A child forked while another thread held the lock would otherwise wait for ever.
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, *args: Hashable) -> T:
        try:
            return self.made[args]
        except KeyError:
            pass
        with self.lock:
            if args not in self.made:
                self.made[args] = self.make(*args)
            return self.made[args]

"""Objects a process makes once and keeps: its Redis client, its Kubernetes client.

``functools.lru_cache`` is not enough for them: threads asking at the same moment (a thread-pool
worker's first runs start together) each make one, and all but the last are replaced in the
memo and dropped. A dropped redis-py client made by ``from_url`` closes its connection pool -
connections still in use by another thread's pipeline included - so that thread's read fails
on a closed buffer or hangs. Here the first caller makes it under a lock and the others wait.
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, Hashable, TypeVar

T = TypeVar("T")


def per_process(make: Callable[..., T]) -> Callable[..., T]:
    """``make(*args)`` once per distinct ``args`` (hashable); every caller gets that one."""
    made: dict[tuple[Hashable, ...], T] = {}
    lock = threading.Lock()

    @functools.wraps(make)
    def get(*args: Hashable) -> T:
        try:
            return made[args]
        except KeyError:
            pass
        with lock:
            if args not in made:
                made[args] = make(*args)
            return made[args]

    return get

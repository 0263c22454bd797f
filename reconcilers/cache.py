"""The shared informer cache in Redis: the watcher writes objects, reconcilers read them.

Workers are separate processes, so client-go's in-memory Indexer becomes a Redis hash per
watched resource. Only this module knows the key layout.
"""

from __future__ import annotations

import functools

import redis
from django.conf import settings


@functools.lru_cache(maxsize=None)
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5,
                                health_check_interval=30)


def get_redis() -> redis.Redis:
    """One connection pool per process and URL (redis-py pools are thread-safe)."""
    return _client_for(settings.REDIS_URL)

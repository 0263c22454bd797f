"""A reconciler's rate limit across every worker: one token bucket in Redis.

Celery's ``rate_limit`` is a token bucket per worker process, so ``"10/s"`` on four workers
lets forty runs a second through. client-go's overall limiter is one bucket per controller;
``Reconciler.shared_rate_limit`` is that bucket here, kept in the shared cache's Redis and
taken atomically by a Lua script (redis-py's ``register_script``) on the Redis server's clock,
so hosts with different clocks share it fairly. Its capacity is one token: no burst beyond
the rate.

A message that finds the bucket empty is not run: its key is sent again, with the same token,
to arrive when the next token is due (plus a little jitter, so workers told the same wait do
not all come back at once). The ledger keeps the key queued meanwhile; nothing is claimed,
attempted or recorded, and the reaper's re-send stays harmless (a duplicate is dropped by its
token).
"""

from __future__ import annotations

import functools
import random
import re

import redis

from reconcilers._kube.cache import get_redis

# Returns the milliseconds until a token is due (0: one was taken now).
_TAKE = """
local rate = tonumber(ARGV[1])
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or 1
local at = tonumber(state[2]) or now
tokens = math.min(1, tokens + (now - at) * rate / 1000)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(2000 / rate) + 1000)
return wait
"""
_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"(\d+(?:\.\d+)?)/([smh])")


def per_second(rate: str) -> float:
    """``"10/s"``, ``"100/m"``, ``"5/h"`` (Celery's notation) as tokens per second."""
    match = _RATE.fullmatch(str(rate))
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{rate!r} is not a rate like '10/s', '100/m' or '5/h'")
    return float(match.group(1)) / _PERIODS[match.group(2)]


def take(reconciler: str, rate: str) -> float:
    """Take a token of ``reconciler``'s shared bucket: 0 when one was taken, else the seconds
    to wait before asking again."""
    per = per_second(rate)
    wait_ms = int(_script(get_redis())(keys=[f"operator:ratelimit:{reconciler}"], args=[per]))
    if wait_ms <= 0:
        return 0.0
    return wait_ms / 1000 + random.uniform(0, 1 / per)


@functools.lru_cache(maxsize=8)
def _script(client: redis.Redis):
    return client.register_script(_TAKE)

"""Whether the Redis that holds the cache is still the one the watcher wrote to.

The cache outlives its watcher, and what Redis keeps of it can go back in time: Redis
restarted from an older snapshot, or a replica promoted by a failover before it had the last
writes, holds synced markers that look alive (``cache.keep_synced`` only extends them) over a
cache that lacks what was written since - while the watcher's streams go on from their
positions in memory. Runs would read "not found" for an object created in that window.

``Epoch`` is a watcher's memory of the Redis it writes: the server's ``run_id`` (``INFO
server``: new at every start of a Redis process, another on a promoted replica) and a
generation key of its own, ``operator:epoch:<token>`` (a token per ``Epoch``), moved by every
``check``. ``check`` says False when either is not as it left them:

- Redis restarted (whatever it loaded) or failed over: another ``run_id``;
- the data was emptied or replaced without a restart (``FLUSHDB``, ``FLUSHALL``, ``DEBUG
  RELOAD`` of an older file): the key gone, or at an older generation.

The watcher then relists every stream (``lifecycle``). The cost is a relist after every Redis
restart, also one that kept every write (an AOF fsynced always, a saving ``SHUTDOWN``): a
restart cannot tell which writes it kept, and a stream's own synced marker cannot either -
the stream's next write moves it to the current position whether or not the writes before it
survived. Such a relist is one LIST per stream and enqueues nothing, since what the cache
holds is current. A rollback without a restart quicker than one check (a second) goes
unnoticed; Redis has no such operation.

Where ``INFO`` is refused (an ACL without ``@dangerous``, some proxies), only the key is
checked: a flush is noticed, a restart from a snapshot that holds the key is not.

Keys: only this module knows ``operator:epoch:<token>``.
"""

from __future__ import annotations

import logging
import uuid

import redis

from reconcilers._kube.cache import SYNCED_TTL, get_redis

log = logging.getLogger(__name__)


class Epoch:
    """One watcher's record of its Redis. Not thread-safe: one thread checks (the watcher's
    supervisor, once a second)."""

    def __init__(self) -> None:
        self._key = f"operator:epoch:{uuid.uuid4().hex}"
        self._generation = 0  # the key's value as this epoch last set it (0: not yet)
        self._run_id: str | None = None
        self._info = True  # whether this Redis answers INFO
        self.last_change = ""  # what the last failed check found, for the log

    def check(self) -> bool:
        """False when Redis lost or went back on what this epoch last saw (the first call
        only records it). Either way, what Redis holds now is what the next call compares
        against. Raises ``redis.RedisError`` when Redis cannot be asked."""
        run_id = self._server_run_id()
        # One transaction: the generation read and moved together. The key expires as the
        # synced markers do, if no watcher keeps it.
        pipe = get_redis().pipeline(transaction=True)
        pipe.get(self._key)
        pipe.set(self._key, self._generation + 1, ex=SYNCED_TTL)
        held, _ = pipe.execute()
        held = int(held) if held is not None else 0
        first = self._generation == 0
        changes = []
        if not first and run_id != self._run_id:
            changes.append(f"run_id {self._run_id} -> {run_id}")
        if not first and held != self._generation:
            changes.append(f"generation {self._generation} -> {held or 'none'}")
        self._generation += 1
        self._run_id = run_id
        self.last_change = "; ".join(changes)
        return not changes

    def _server_run_id(self) -> str | None:
        if not self._info:
            return None
        try:
            return get_redis().info("server").get("run_id")
        except redis.ResponseError as exc:  # INFO refused: only the generation key counts
            log.warning("Redis refuses INFO (%s): a restart from a snapshot that kept the "
                        "watcher's epoch key goes unnoticed", exc)
            self._info = False
            return None

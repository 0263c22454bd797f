"""The journal of changes cached but not yet in the work queue.

The watcher writes an object to the cache *before* its key reaches the ledger. A watcher that
dies in between would lose the change: after a restart the relist finds the cache already up to
date. So every change is also journalled (``record``), in the same batch as the cache write,
and cleared (``clear``) only once its keys are in the ledger; a new leader replays what is left
(``pending``; ``streams.replay_journal`` routes it).

Keys: only this module knows ``operator:pending`` (a hash, field ``<resource>|<path>``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Iterable

import redis

from reconcilers._kube.cache import get_redis

_PENDING = "operator:pending"
_CLEAR_IF_SAME = """
for i = 1, #KEYS do
  local raw = redis.call('HGET', ARGV[1], KEYS[i])
  if raw and cjson.decode(raw)['t'] == ARGV[i + 1] then redis.call('HDEL', ARGV[1], KEYS[i]) end
end
return 0
"""


@dataclass(frozen=True)
class Change:
    """A journalled change: enough to route it again and the token that clears exactly this
    entry, not a newer one of the object. The journal keeps the object only for a deletion
    (its last state names the owner); a live object is read back from the cache on replay."""

    resource: str  # GVR.id
    path: str
    obj: dict | None  # None when read back from the journal for a live object
    deleted: bool
    token: str

    @property
    def field(self) -> str:
        return f"{self.resource}|{self.path}"


def record(change: Change, pipe: redis.client.Pipeline) -> None:
    """Journal ``change`` in ``pipe``: the batch that writes it to the cache."""
    pipe.hset(_PENDING, change.field, json.dumps(
        {"t": change.token, "d": change.deleted, "o": change.obj if change.deleted else None},
        separators=(",", ":")))


def clear(changes: Iterable[Change]) -> None:
    """Forget changes whose keys are in the ledger (unless the object changed again since)."""
    changes = list(changes)
    for start in range(0, len(changes), 500):
        chunk = changes[start:start + 500]
        _clear_script(get_redis())(keys=[c.field for c in chunk],
                                   args=[_PENDING, *[c.token for c in chunk]])


@functools.lru_cache(maxsize=8)
def _clear_script(client: redis.Redis):
    """redis-py's registered script: EVALSHA, loading the script again if Redis lost it (a
    restart, SCRIPT FLUSH) - the script's text crosses the wire once, not on every clear."""
    return client.register_script(_CLEAR_IF_SAME)


def pending() -> list[Change]:
    """Every change still journalled: what no watcher got into the ledger."""
    out = []
    for raw_field, raw in get_redis().hscan_iter(_PENDING, count=1000):
        resource, _, path = raw_field.decode().partition("|")
        entry = json.loads(raw)
        out.append(Change(resource, path, entry["o"], entry["d"], entry["t"]))
    return out

"""The leader-term fence on the shared cache: a paused ex-leader writes nothing.

Every write of a watcher's stream carries its leader's term (``Term``: the Lease's
``leaseTransitions`` when it took the Lease) and goes through one Lua script that first compares
it with the fence, ``operator:term:<lease>`` (the highest term Redis has seen for that Lease):
a lower term is refused (``StaleTerm``) and nothing of its batch is written; a higher one
raises the fence. So a paused ex-leader whose write arrives after its successor's writes
nothing - the comparison and the write are one script, with nothing in between.

Keys: only this module knows ``operator:term:<lease>``; what a batch writes is the cache's
(``cache``) and the journal's (``journal``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import redis
from django.conf import settings

from reconcilers._base.once import per_process
from reconcilers._kube.cache import Batch, get_redis


class StaleTerm(Exception):
    """A newer leader writes this cache: the write of an older term was refused."""

    def __init__(self, term: "Term", fence: int):
        super().__init__(f"term {term.number} of Lease {term.lease} is stale: a leader of "
                         f"term {fence} writes the cache now")
        self.term, self.fence = term, fence


@dataclass(frozen=True)
class Term:
    """A leader's term: its Lease (``<namespace>/<name>``) and the Lease's
    ``leaseTransitions`` when it took it. The api-server orders acquisitions (each one is an
    update conditional on the Lease's resourceVersion), so a successor's term is always
    higher - unlike a counter a new leader would bump in Redis, which a paused ex-leader
    could bump after its successor."""

    lease: str
    number: int

    @property
    def fence_key(self) -> str:
        return f"operator:term:{self.lease}"


# KEYS[1]: the fence; ARGV[1]: the writer's term, then each command as its argument count
# and its arguments. Returns {1, fence} when applied, {0, fence} when refused.
_FENCED = """
local fence = tonumber(redis.call('GET', KEYS[1]) or '-1')
local term = tonumber(ARGV[1])
if term < fence then return {0, fence} end
if term > fence then redis.call('SET', KEYS[1], ARGV[1]) end
local i = 2
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  redis.call(unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
return {1, term}
"""

# Arguments per command inside the script: Lua's ``unpack`` stops near 8,000 values.
_MAX_ARGS = 2000
# Commands whose arguments after the key (all of them for DEL) may be split into several
# commands of the same effect, and how many arguments make one item.
_SPLITTABLE = {b"HSET": 2, b"HDEL": 1, b"SADD": 1, b"SREM": 1}


class FencedBatch:
    """A ``Batch`` of a leader's writes, applied by the fence script: all of them if ``term``
    is current, none if a newer leader's term is in Redis (``StaleTerm``). Atomic as a script
    is: no other client's command runs in between. Unlike MULTI, a command Redis refuses
    part-way (a wrong type) leaves the ones before it applied; the cache sends only hash, set
    and string writes of keys it owns. Commands are recorded on a redis-py pipeline, which
    is never sent itself."""

    def __init__(self, term: Term):
        self.term = term
        self._pipe = get_redis().pipeline(transaction=False)

    def __getattr__(self, name: str):  # hset, hdel, set, sadd, srem, delete: recorded
        return getattr(self._pipe, name)

    def execute(self) -> None:
        argv: list = [self.term.number]
        for args, _ in self._pipe.command_stack:
            for part in _split(args):
                argv += [len(part), *part]
        self._pipe.reset()
        applied, fence = _fenced_script(get_redis())(keys=[self.term.fence_key], args=argv)
        if not applied:
            raise StaleTerm(self.term, int(fence))


def _split(args: tuple) -> list[tuple]:
    if len(args) <= _MAX_ARGS:
        return [args]
    name = args[0].upper().encode() if isinstance(args[0], str) else args[0].upper()
    if name == b"DEL":
        return [(args[0], *args[i:i + _MAX_ARGS]) for i in range(1, len(args), _MAX_ARGS)]
    width = _SPLITTABLE.get(name)
    if width is None:
        raise ValueError(f"{name.decode()} with {len(args)} arguments is too long to fence")
    step = _MAX_ARGS // width * width
    return [(args[0], args[1], *args[i:i + step]) for i in range(2, len(args), step)]


@functools.lru_cache(maxsize=8)
def _fenced_script(client: redis.Redis):
    return client.register_script(_FENCED)


@per_process
def _prompt_client_for(url: str) -> redis.Redis:
    """The client of the leader's own fence calls: they run inside its renew deadline, so
    they give up within 2 s, not 10 - a black-holed Redis must not hold a round past it."""
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def raise_fence(term: Term) -> int:
    """Raise the fence of ``term``'s Lease to it (never lower it); returns the fence after -
    above ``term`` when a newer leader, or an older history of the Lease, has been here.
    A new leader calls it before its streams start."""
    client = _prompt_client_for(settings.REDIS_URL)
    applied, fence = _fenced_script(client)(keys=[term.fence_key], args=[term.number])
    return int(fence) if not applied else term.number


def Writes(term: Term | None) -> "redis.client.Pipeline | FencedBatch":  # noqa: N802
    """A watcher's batch of cache writes: fenced by its leader's ``term``, or a plain
    ``Batch`` where no leader election runs (one watcher, nothing to fence against)."""
    return Batch() if term is None else FencedBatch(term)

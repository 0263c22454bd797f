"""The leader-term fence on the real Redis: a stale term's batch is refused whole, the fence
only rises, and long commands still go in one script."""

from __future__ import annotations

import pytest

from reconcilers._base.vocab import GVR
from reconcilers._kube import cache, fence, journal

FOOS = GVR.of("example.com/v1", "Foo")


def foo(ns, name, rv="1", **extra):
    return {"apiVersion": "example.com/v1", "kind": "Foo",
            "metadata": {"namespace": ns, "name": name, "resourceVersion": rv, **extra}}


LEASE = "ns/watcher"


def test_a_write_of_a_stale_term_is_refused_whole_and_the_successors_kept(redis_client):
    """A paused ex-leader's batch (term 5) arriving after its successor's (term 6) writes
    nothing: not the object, not its journal entry, not the stream's position."""
    old, new = fence.Term(LEASE, 5), fence.Term(LEASE, 6)
    assert fence.raise_fence(old) == 5
    cache.mark_synced(FOOS, "a", "1", "s")
    assert fence.raise_fence(new) == 6  # the successor leads

    fresh = fence.Writes(new)
    cache.put_many(FOOS, [foo("a", "x", rv="7")], fresh)
    cache.advance(FOOS, "a", "7", "s", fresh)
    fresh.execute()

    stale = fence.Writes(old)
    cache.put_many(FOOS, [foo("a", "x", rv="5"), foo("a", "y", rv="5")], stale)
    journal.record(journal.Change(FOOS.id, "a/x", None, False, "t"), stale)
    cache.advance(FOOS, "a", "5", "s", stale)
    with pytest.raises(fence.StaleTerm) as refused:
        stale.execute()
    assert refused.value.fence == 6
    assert cache.get(FOOS, "a", "x")["metadata"]["resourceVersion"] == "7"
    assert cache.get(FOOS, "a", "y") is None
    assert journal.pending() == []
    assert cache.resume_point(FOOS, "a", "s") == "7"


def test_the_fence_only_rises_and_each_lease_has_its_own(redis_client):
    assert fence.raise_fence(fence.Term(LEASE, 3)) == 3
    assert fence.raise_fence(fence.Term(LEASE, 2)) == 3  # an older term never lowers it
    write = fence.Writes(fence.Term(LEASE, 4))  # a newer term's first write raises it
    write.set("t:k", "v")
    write.execute()
    assert fence.raise_fence(fence.Term(LEASE, 0)) == 4
    assert fence.raise_fence(fence.Term("ns/other", 0)) == 0  # another deployment's Lease


def test_a_fenced_list_of_many_objects_and_index_keys_goes_in_one_script(redis_client):
    """Lua's ``unpack`` stops near 8,000 values: long commands are split inside the script."""
    term = fence.Term(LEASE, 1)
    for j in range(0, 5000, 1000):
        redis_client.sadd(f"t:idx:{j}", "x")
    batch = fence.Writes(term)
    cache.put_many(FOOS, [foo("a", f"o{i}") for i in range(10_000)], batch)
    batch.delete(*[f"t:idx:{j}" for j in range(0, 5000, 1000)],
                 *[f"t:none:{j}" for j in range(9000)])
    batch.sadd("t:set", *[str(i) for i in range(9000)])
    batch.execute()
    assert cache.count(FOOS) == 10_000
    assert redis_client.scard("t:set") == 9000
    assert not redis_client.exists("t:idx:0")


def test_without_leader_election_a_batch_is_unfenced(redis_client):
    batch = fence.Writes(None)
    batch.set("t:k", "v")
    batch.execute()
    assert redis_client.get("t:k") == b"v"

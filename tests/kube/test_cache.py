"""The shared informer cache on the real Redis: sanitised objects, scoped synced markers."""

from __future__ import annotations

from reconcilers._kube import cache
from reconcilers._base.vocab import GVR
from tests.helpers import in_threads, made_together

SECRETS = GVR.of("v1", "Secret")
FOOS = GVR.of("example.com/v1", "Foo")


def foo(ns, name, rv="1", **extra):
    return {"apiVersion": "example.com/v1", "kind": "Foo",
            "metadata": {"namespace": ns, "name": name, "resourceVersion": rv, **extra}}


def test_objects_are_stored_without_managed_fields_last_applied_or_secret_data(redis_client):
    cache.put_many(FOOS, [foo("a", "x", managedFields=[{"manager": "kubectl"}], annotations={
        cache.LAST_APPLIED: "{...}", "keep": "me"})])
    cache.put_many(SECRETS, [{"kind": "Secret", "metadata": {"namespace": "a", "name": "s"},
                              "data": {"password": "c2VjcmV0"}, "stringData": {"p": "x"}}])
    stored = cache.get(FOOS, "a", "x")
    assert "managedFields" not in stored["metadata"]
    assert stored["metadata"]["annotations"] == {"keep": "me"}
    secret = cache.get(SECRETS, "a", "s")
    assert "data" not in secret and "stringData" not in secret
    assert b"c2VjcmV0" not in b"".join(redis_client.hvals(f"operator:obj:{SECRETS.id}"))


def test_objects_of_one_namespace_are_read_apart_from_the_others(redis_client):
    cache.put_many(FOOS, [foo("a", "x"), foo("a", "y"), foo("b", "x"), foo("ab", "z")])
    assert sorted(cache.objects(FOOS, "a")) == ["a/x", "a/y"]
    assert sorted(cache.objects(FOOS)) == ["a/x", "a/y", "ab/z", "b/x"]
    cache.delete(FOOS, "a", "x")
    assert cache.get(FOOS, "a", "x") is None and cache.get(FOOS, "b", "x") is not None


def test_a_namespace_is_synced_by_its_own_list_or_by_a_list_of_all(redis_client):
    assert not cache.is_synced(FOOS, "a")
    cache.mark_synced(FOOS, "a", "10")
    assert cache.is_synced(FOOS, "a")
    assert not cache.is_synced(FOOS, "b")  # a miss in b does not yet mean "deleted"
    assert not cache.is_synced(FOOS)
    cache.mark_synced(FOOS, None, "11")
    assert cache.is_synced(FOOS, "b") and cache.is_synced(FOOS)


def test_a_run_reads_its_object_and_whether_a_miss_means_deleted_in_one_answer(redis_client):
    cache.put_many(FOOS, [foo("a", "x")])
    assert cache.get_if_synced(FOOS, "a", "x") == (False, foo("a", "x"))
    assert cache.get_if_synced(FOOS, "a", "gone") == (False, None)  # not listed: ask the API
    cache.mark_synced(FOOS, "a", "10")
    assert cache.get_if_synced(FOOS, "a", "x") == (True, foo("a", "x"))
    assert cache.get_if_synced(FOOS, "a", "gone") == (True, None)  # listed: deleted
    assert cache.get_if_synced(FOOS, "b", "x") == (False, None)


def test_a_redis_restart_empties_the_markers_too(redis_client):
    cache.mark_synced(FOOS, None, "11")
    redis_client.flushdb()
    assert not cache.is_synced(FOOS, "a")


def test_a_synced_marker_expires_unless_its_watcher_keeps_it(redis_client):
    cache.mark_synced(FOOS, "a", "10")
    assert 0 < redis_client.ttl(f"operator:synced:{FOOS.id}:a") <= cache.SYNCED_TTL
    assert cache.keep_synced(FOOS, "a")
    redis_client.delete(f"operator:synced:{FOOS.id}:a")
    assert not cache.keep_synced(FOOS, "a")  # gone: the watcher must relist


def test_threads_starting_at_once_share_one_client_whose_connections_no_one_closes(
        redis_client, settings, monkeypatch):
    """A thread-pool worker's first runs start together, each asking for the process's client.
    Two clients made at once, one replaced in the memo, closed their pool when the replaced
    one was dropped - connections of it still in use included: a run's pipeline then read from
    a closed buffer ("I/O operation on closed file") or hung past its deadline."""
    import redis

    settings.REDIS_URL = f"{settings.REDIS_URL}?client_name=first-use-race"
    slow_from_url, made = made_together(redis.Redis.from_url, 4)
    monkeypatch.setattr(redis.Redis, "from_url", slow_from_url)

    def first_read():
        client = cache.get_redis()
        cache.get_if_synced(FOOS, "a", "x")
        return client

    got = in_threads(first_read, 4)
    assert not [r for r in got if isinstance(r, Exception)], got
    assert len(made) == 1 and len({id(c) for c in got}) == 1 and cache.get_redis() is got[0]


def test_redis_replies_are_parsed_by_hiredis(redis_client):
    """The C parser and packer are installed with the framework: in pure Python they were a
    sixth of the watcher's CPU."""
    from redis._parsers import _HiredisParser

    connection = cache.get_redis().connection_pool.get_connection()
    try:
        assert isinstance(connection._parser, _HiredisParser)
    finally:
        cache.get_redis().connection_pool.release(connection)


def test_a_batch_applies_all_of_its_commands_or_none(redis_client):
    """What the watcher writes per event (object, index entries, journal, position) is one
    Batch: a refused command discards the others, so the stream's position never moves past
    an object the cache did not take."""
    import pytest
    import redis

    batch = cache.Batch()
    batch.hset("t:objects", mapping={"a/x": "1", "a/y": "2"})
    batch.hset("t:journal", "a/x", "j")
    batch.sadd("t:index", "a/x", "a/y")
    batch.set("t:position", "s 1")
    batch.exists("t:objects", "t:none")
    assert batch.execute() == [2, 1, 2, True, 1]

    refused = cache.Batch()
    refused.set("t:position", "s 2")
    refused.execute_command("HSET", "t:objects")  # wrong arity: refused while queueing
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        refused.execute()
    assert redis_client.get("t:position") == b"s 1"

    failing = cache.Batch()
    failing.hset("t:position", "f", "v")  # WRONGTYPE when applied
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        failing.execute()

    after = cache.Batch(transaction=False)  # the connection is still in step with its replies
    after.hget("t:objects", "a/y")
    after.hget("t:objects", "a/none")
    after.srem("t:index", "a/y")
    after.hdel("t:journal", "a/x")
    after.delete("t:index")
    assert after.execute() == [b"2", None, 1, 1, 1]


def test_a_batch_survives_its_connection_being_dropped(redis_client):
    """Redis restarting, or a proxy closing an idle connection: the next batch goes out on a
    new connection instead of failing the stream."""
    first = cache.Batch()
    first.set("t:k", "1")
    first.execute()
    redis_client.client_kill_filter(_type="normal", skipme=True)  # every other connection
    again = cache.Batch()
    again.set("t:k", "2")
    again.execute()
    assert redis_client.get("t:k") == b"2"

"""The watcher's record of its Redis, against a real Redis server of the test's own: whatever
lost or rolled back what the watcher wrote is noticed, a dropped connection is not."""

from __future__ import annotations

from reconcilers._kube.epoch import Epoch


def test_a_redis_that_kept_everything_is_noticed_by_nothing(private_redis, settings):
    settings.REDIS_URL = private_redis.url
    epoch = Epoch()
    assert epoch.check()  # the first check only records what Redis holds
    assert epoch.check()
    with private_redis.client() as r:  # every client's connection dropped; Redis the same
        r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no")
    assert epoch.check()


def test_a_flushed_redis_is_noticed_once(private_redis, settings):
    settings.REDIS_URL = private_redis.url
    epoch = Epoch()
    epoch.check()
    with private_redis.client() as r:
        r.flushdb()
    assert not epoch.check()
    assert "generation" in epoch.last_change
    assert epoch.check()  # what Redis holds now is the new record


def test_a_redis_restarted_from_an_older_snapshot_is_noticed(private_redis, settings):
    settings.REDIS_URL = private_redis.url
    epoch = Epoch()
    epoch.check()
    snapshot = private_redis.save()
    assert epoch.check()  # written after the snapshot: the snapshot lacks it
    private_redis.restart(snapshot)
    assert not epoch.check()
    assert "run_id" in epoch.last_change and "generation" in epoch.last_change


def test_a_redis_restarted_with_every_write_is_noticed_too(private_redis, settings):
    """The trade-off the module states: a restart cannot say which writes it kept, so one
    that kept them all costs a relist as well."""
    settings.REDIS_URL = private_redis.url
    epoch = Epoch()
    epoch.check()
    private_redis.restart()  # saved on the way down, loaded on the way up
    assert not epoch.check()
    assert epoch.last_change.startswith("run_id") and "generation" not in epoch.last_change

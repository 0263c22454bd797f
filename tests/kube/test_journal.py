"""The journal of changes not yet in the ledger, on the real Redis: a clear forgets exactly the
change it names, never a newer one of the same object, and keeps working after Redis loses its
scripts (a restart, SCRIPT FLUSH)."""

from __future__ import annotations

from reconcilers._base.vocab import GVR
from reconcilers._kube import cache, journal

FOOS = GVR.of("example.com/v1", "Foo")


def journalled(*changes: journal.Change) -> None:
    batch = cache.Batch()
    for change in changes:
        journal.record(change, batch)
    batch.execute()


def test_a_clear_forgets_its_change_and_keeps_a_newer_one_of_the_same_object(redis_client):
    journalled(journal.Change(FOOS.id, "a/x", None, False, "t1"),
               journal.Change(FOOS.id, "a/y", None, False, "t2"))
    journalled(journal.Change(FOOS.id, "a/y", None, False, "t3"))  # y changed again since
    journal.clear([journal.Change(FOOS.id, "a/x", None, False, "t1"),
                   journal.Change(FOOS.id, "a/y", None, False, "t2")])
    assert [(c.path, c.token) for c in journal.pending()] == [("a/y", "t3")]


def test_a_clear_works_after_redis_lost_its_scripts(redis_client):
    """The clear is a registered script (EVALSHA): after a Redis restart the script cache is
    empty, and the clear must load it again rather than fail and leave the journal full."""
    journalled(journal.Change(FOOS.id, "a/x", None, False, "t1"))
    journal.clear([journal.Change(FOOS.id, "a/other", None, False, "t0")])  # script now cached
    redis_client.script_flush()
    journal.clear([journal.Change(FOOS.id, "a/x", None, False, "t1")])
    assert journal.pending() == []

"""The work queue pairs each ledger transition with its messages (real PostgreSQL; the sender
is replaced by a recorder, so these tests see exactly what would be published)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import transaction

from reconcilers._queue import workqueue
from reconcilers._base.reconcile import Decision, Dispatch, Key
from reconcilers.models import WorkItem

pytestmark = pytest.mark.django_db(transaction=True)

KEY = Key("probes.test.operator.local", "ns", "a")


@pytest.fixture
def sent(monkeypatch):
    messages: list[tuple[Key, int, float | None, str]] = []
    monkeypatch.setattr(workqueue, "_sender",
                        lambda d, task_id: messages.append((d.key, d.token, d.countdown, task_id)))
    monkeypatch.setattr(workqueue, "_sender_many", None)  # a message per key
    return messages


@pytest.fixture
def shared(monkeypatch, sent):
    """As ``sent``, plus messages carrying several keys: ``([(key, token), ...], task_id)``."""
    messages: list[tuple[list[tuple[Key, int]], str]] = []
    monkeypatch.setattr(workqueue, "_sender_many", lambda ds, task_id: messages.append(
        ([(d.key, d.token) for d in ds], task_id)))
    return messages


def test_adding_a_key_sends_one_message_with_the_id_of_key_and_token(sent):
    assert workqueue.add([KEY, KEY], "added") == 1
    assert workqueue.add([KEY], "modified") == 0  # already queued: dedup
    assert sent == [(KEY, 1, None, f"{KEY}#1")]


def test_messages_wait_for_the_commit_and_vanish_with_a_rollback(sent):
    with pytest.raises(RuntimeError), transaction.atomic():
        workqueue.add([KEY], "added")
        assert sent == []
        raise RuntimeError("rolled back")
    assert sent == [] and not WorkItem.objects.exists()
    with transaction.atomic():
        workqueue.add([KEY], "added")
        assert sent == []
    assert len(sent) == 1


def test_a_failed_run_sends_its_retry_as_a_new_message_with_a_new_id(sent):
    workqueue.add([KEY], "added")
    claim = workqueue.claim(KEY, 1, "w", 60)
    follow = workqueue.done(claim, Decision("error", 1, 0.005, "retry",
                                            error_message="boom")).follow_up
    assert sent[-1] == (KEY, follow.token, 0.005, f"{KEY}#{follow.token}")
    assert follow.token == 2


def test_a_success_sends_nothing_unless_an_event_came_meanwhile(sent):
    workqueue.add([KEY], "added")
    claim = workqueue.claim(KEY, 1, "w", 60)
    workqueue.done(claim, Decision("success"))
    assert len(sent) == 1
    workqueue.add([KEY], "modified")
    claim = workqueue.claim(KEY, 2, "w", 60)
    workqueue.add([KEY], "modified")  # during the run: dirty, no message now
    assert len(sent) == 2
    workqueue.done(claim, Decision("success"))
    assert sent[-1][1] == 3  # the dirty re-run


def test_pausing_holds_messages_and_resuming_sends_them(sent):
    workqueue.add([KEY], "added")
    workqueue.pause([KEY], True)
    assert workqueue.claim(KEY, 1, "w", 60) is None
    assert workqueue.pause([KEY], False) == 1
    assert sent[-1][1] == 2


def test_a_broker_outage_is_logged_and_left_to_the_reaper(monkeypatch, caplog):
    def down(d, task_id):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(workqueue, "_sender", down)
    workqueue.add([KEY], "added")
    assert "the reaper will retry" in caplog.text
    assert WorkItem.objects.get().state == "queued"  # the ledger still holds the key


def test_without_a_sender_sending_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(workqueue, "_sender", None)
    with pytest.raises(RuntimeError, match="INSTALLED_APPS"):
        workqueue.send([Dispatch(KEY, 1)])


def test_the_broker_sender_is_installed_by_the_app():
    from reconcilers._queue import broker

    assert workqueue._sender is broker.publish
    assert workqueue._sender_many is broker.publish_many


def test_many_messages_reach_the_broker_in_one_batch(redis_client):
    """A relist's dispatches reach Redis together: every message arrives, and is a normal
    Celery message a worker would run."""
    import json

    from reconcilers._queue import broker

    queue = broker.default_queue()
    redis_client.delete(queue)
    dispatches = [Dispatch(Key("widgets.nowhere.example.com", "ns", f"k{i}"), 1)
                  for i in range(120)]
    assert workqueue._batch is broker.batch
    assert workqueue.send(dispatches) == 120
    messages = [json.loads(m) for m in redis_client.lrange(queue, 0, -1)]
    redis_client.delete(queue)
    assert sorted(m["headers"]["id"] for m in messages) == sorted(
        workqueue.task_id(d.key, d.token) for d in dispatches)
    assert {m["headers"]["task"] for m in messages} == {"reconcilers.reconcile_unregistered"}


def test_a_batch_the_broker_never_took_counts_as_unsent(monkeypatch, caplog, sent):
    import contextlib

    @contextlib.contextmanager
    def flush_fails():
        yield
        raise ConnectionError("redis went away at the flush")

    monkeypatch.setattr(workqueue, "_batch", flush_fails)
    workqueue.add([Key(KEY.reconciler, "ns", n) for n in "abc"], "added")
    assert "could not send 3 messages" in caplog.text
    assert workqueue.send([Dispatch(KEY, 1), Dispatch(KEY, 2)]) == 0
    assert WorkItem.objects.filter(state="queued").count() == 3  # the reaper re-sends them


def keys(*names: str, reconciler: str = KEY.reconciler) -> list[Key]:
    return [Key(reconciler, "ns", n) for n in names]


def test_keys_due_together_share_messages_up_to_the_limit_and_delays_go_alone():
    other = Key("widgets.example.com", "ns", "w")
    ds = [Dispatch(k, 1) for k in keys("a", "b", "c", "d", "e")]
    delayed = Dispatch(Key(KEY.reconciler, "ns", "late"), 4, countdown=0.5)
    packed = workqueue.messages([ds[0], delayed, ds[1], Dispatch(other, 2), *ds[2:]],
                                per_message=2)
    assert packed == [[ds[0], ds[1]], [delayed], [Dispatch(other, 2)],
                      [ds[2], ds[3]], [ds[4]]]
    assert workqueue.messages(ds, per_message=1) == [[d] for d in ds]


def test_a_relist_sends_its_keys_in_shared_messages_each_key_once(sent, shared, settings):
    settings.RECONCILERS_KEYS_PER_MESSAGE = 4
    assert workqueue.add(keys(*"abcdefghij"), "added") == 10
    assert [len(ks) for ks, _ in shared] == [4, 4, 2] and sent == []
    carried = [k for ks, _ in shared for k in ks]
    assert sorted(carried) == sorted((k, 1) for k in keys(*"abcdefghij"))
    # The message's id names its first key's dispatch and how many more it carries.
    assert [task_id for _, task_id in shared] == [
        f"{ks[0][0]}#1+{len(ks) - 1}" for ks, _ in shared]
    workqueue.add(keys("k"), "added")  # a single key still travels alone, under its own id
    assert sent == [(keys("k")[0], 1, None, f"{keys('k')[0]}#1")]


def test_a_shared_message_the_broker_refused_leaves_every_key_it_carried_to_the_reaper(
        monkeypatch, sent, caplog, settings):
    def down(ds, task_id):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(workqueue, "_sender_many", down)
    assert workqueue.add(keys(*"abc"), "added") == 3  # queued in the ledger all the same
    assert "and 2 more" in caplog.text and "the reaper will retry" in caplog.text
    assert WorkItem.objects.filter(state="queued").count() == 3


@pytest.mark.parametrize("forget", ["in", "outside"])
def test_forgetting_a_scopes_keys_never_deadlocks_with_an_enqueue_and_forgets_them(
        forget, sent):
    """A deployment that stopped watching a namespace forgets its keys (``scopes``) while the
    watcher, a manual action or a finished run may be enqueueing the same keys - in the
    ledger's lock order, the key's. The forgetting must take them in that order too: taken in
    the order the rows lie on disk (created "z..." first), it would hold "z..." while an
    enqueue holding "a..." waited for it, and PostgreSQL would end one of them."""
    from .test_ledger import _race

    created_first, created_next = Key(KEY.reconciler, "gone", "z-made-first"), \
        Key(KEY.reconciler, "gone", "a-made-next")
    kept = Key(KEY.reconciler, "kept", "stays")
    for k in (created_first, created_next, kept):
        workqueue.add([k], "added")
    holds_first = threading.Event()

    def enqueue_in_key_order() -> None:
        with transaction.atomic():
            workqueue.add([created_next], "modified")
            holds_first.set()
            time.sleep(0.3)  # the forgetting runs meanwhile
            workqueue.add([created_first], "modified")

    def forget_meanwhile() -> None:
        assert holds_first.wait(5)
        time.sleep(0.05)
        if forget == "in":
            workqueue.forget_in(KEY.reconciler, ["gone"])
        else:
            workqueue.forget_outside({KEY.reconciler: {"kept"}})

    assert _race(enqueue_in_key_order, forget_meanwhile) == []
    assert list(WorkItem.objects.values_list("namespace", flat=True)) == ["kept"]

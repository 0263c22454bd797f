"""A worker's broker connection through a real fault proxy (Toxiproxy): what a reset or a black
hole between a Celery worker and Redis leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from reconcilers.models import ReconcileRecord, WorkItem
from tests.helpers import free_port, http_get

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PROBE = "probes.test.operator.local"


def _status(port: int, path: str) -> int:
    """The endpoint's status; 0 when it does not answer."""
    try:
        return http_get(port, path)[0]
    except OSError:
        return 0


@pytest.fixture
def toxiproxy(tmp_path):
    from soak.toxiproxy import Toxiproxy

    proxy = Toxiproxy(tmp_path / "toxiproxy.log")
    yield proxy
    proxy.stop()


def _through(url: str, port: int) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rpartition("@")
    host = f"127.0.0.1:{port}"
    return urllib.parse.urlunsplit(parts._replace(
        netloc=f"{netloc[0]}@{host}" if netloc[1] else host))


@pytest.mark.parametrize("pool", ["threads", "prefork"])
@pytest.mark.parametrize("fault", ["reset", "black hole"])
@pytest.mark.parametrize("target", ["redis", "postgres"])
def test_a_worker_runs_keys_sent_after_its_connections_were_cut(
        operator, toxiproxy, pool, fault, target, worker_db_url):
    """Runs going on and keys arriving while the worker's connections to Redis or PostgreSQL
    are reset or black-holed for a few seconds: once they pass, a key sent afterwards runs."""
    from django.conf import settings

    from reconcilers._base.reconcile import Key
    from reconcilers._queue import workqueue

    port = free_port()
    operator.env["OPERATOR_WORKER_HTTP_PORT"] = str(port)
    if target == "redis":
        redis_port = urllib.parse.urlsplit(settings.REDIS_URL).port
        through = _through(settings.REDIS_URL, toxiproxy.proxy("redis", redis_port))
        operator.env.update({"REDIS_URL": through, "CELERY_BROKER_URL": through})
    else:
        db_port = urllib.parse.urlsplit(worker_db_url).port
        operator.env["DATABASE_URL"] = _through(worker_db_url,
                                                toxiproxy.proxy("postgres", db_port))
    worker = operator.start_worker(concurrency=2, pool=pool)
    workqueue.add([Key(PROBE, operator.namespace, "before")], "test")
    _wait(lambda: ReconcileRecord.objects.filter(name="before").exists(), 60)

    stop = threading.Event()

    def feed() -> None:
        i = 0
        while not stop.is_set():
            workqueue.add([Key(PROBE, operator.namespace, f"busy-{i % 20}")], "test")
            i += 1
            time.sleep(0.02)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        time.sleep(2)
        toxiproxy.add(target, fault)
        time.sleep(8)
        toxiproxy.clear(target)
        time.sleep(2)
    finally:
        stop.set()
        feeder.join()
    workqueue.add([Key(PROBE, operator.namespace, "after")], "test")
    deadline, liveness = time.monotonic() + 90, []
    while not ReconcileRecord.objects.filter(name="after").exists():
        assert time.monotonic() < deadline, (liveness[-10:], worker.log()[-5000:])
        liveness.append(_status(port, "/healthz"))
        time.sleep(1)


def _wait(check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.2)


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_worker_holding_an_unacked_message_outlives_its_broker_going_away(
        operator, toxiproxy, kube, pool):
    """Redis gone while runs are in flight: their messages are unacknowledged (acks_late),
    and closing the lost connection gives them back. The worker must survive that - every
    time - and consume again once Redis answers. Which of its connections fails first is up
    to the kernel, so the outage comes several times."""
    from django.conf import settings
    from kubernetes import client

    from reconcilers._base.reconcile import Key
    from reconcilers._queue import workqueue

    redis_port = urllib.parse.urlsplit(settings.REDIS_URL).port
    through = _through(settings.REDIS_URL, toxiproxy.proxy("redis", redis_port))
    operator.env.update({"REDIS_URL": through, "CELERY_BROKER_URL": through})
    worker = operator.start_worker(concurrency=2, pool=pool)
    objects = client.CustomObjectsApi(kube)
    for i in range(6):
        name = f"slow-{i}"
        objects.create_namespaced_custom_object(
            "test.operator.local", "v1", operator.namespace, "probes", {
                "apiVersion": "test.operator.local/v1", "kind": "Probe",
                "metadata": {"name": name}, "spec": {"value": 1, "sleep": 3}})
        workqueue.add([Key(PROBE, operator.namespace, name)], "test")
        worker.wait_for_log(f"/{name}#", timeout=60)  # received: unacknowledged until it ends
        time.sleep(0.5)
        toxiproxy.enable("redis", False)
        time.sleep(2)
        toxiproxy.enable("redis", True)
        assert worker.popen.poll() is None, worker.log()[-5000:]
    workqueue.add([Key(PROBE, operator.namespace, "after")], "test")
    _wait(lambda: ReconcileRecord.objects.filter(name="after").exists() or
          worker.popen.poll() is not None, 90)
    assert worker.popen.poll() is None, worker.log()[-5000:]
    assert ReconcileRecord.objects.filter(name="after").exists(), worker.log()[-5000:]


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_worker_whose_acknowledgements_failed_consumes_again(operator, toxiproxy, kube, pool):
    """Both slots of a worker busy, so its consumer waits on no read and its connection
    carries nothing; then every connection that carries data is reset: both runs'
    acknowledgements fail ("Couldn't ack") while the consumer's connection survives. The
    worker must take messages again - without a restart (the stall watch is off here): kombu
    keeps a message whose acknowledgement failed counted against the prefetch limit, and a
    worker whose every prefetch slot is taken by such messages never reads again."""
    from django.conf import settings
    from kubernetes import client

    from reconcilers._base.reconcile import Key
    from reconcilers._queue import workqueue

    redis_port = urllib.parse.urlsplit(settings.REDIS_URL).port
    through = _through(settings.REDIS_URL, toxiproxy.proxy("redis", redis_port))
    operator.env.update({"REDIS_URL": through, "CELERY_BROKER_URL": through,
                         "RECONCILERS_WORKER_STALLED_AFTER": "0"})
    # Celery's event heartbeat, sent from the event loop, retries its send there until Redis
    # answers: it would hold the acknowledgements until the fault passes. Without it they meet
    # the fault, as they do whenever they come before the heartbeat's next send.
    worker = operator.start_worker(concurrency=2, pool=pool, args=("--without-heartbeat",))
    objects = client.CustomObjectsApi(kube)
    names = ["slow-0", "slow-1"]
    for name in names:
        objects.create_namespaced_custom_object(
            "test.operator.local", "v1", operator.namespace, "probes", {
                "apiVersion": "test.operator.local/v1", "kind": "Probe",
                "metadata": {"name": name}, "spec": {"value": 1, "sleep": 3}})
        workqueue.add([Key(PROBE, operator.namespace, name)], "test")
    for name in names:
        worker.wait_for_log(f"/{name}#", timeout=60)  # received: both slots taken
    time.sleep(0.5)
    toxiproxy.add("redis", "reset")

    def acks_failed() -> bool:
        """Both acknowledgements failed (past redis-py's own retries); or, with the first
        one's slot freed, the consumer read again and met the fault itself (it reconnects
        then, as for any connection loss)."""
        log = worker.log()
        first, failed, after = log.partition("Couldn't ack")
        return bool(failed) and ("Couldn't ack" in after or "Connection to broker lost" in after)

    try:
        _wait(acks_failed, 60)
    finally:
        toxiproxy.clear("redis")
    workqueue.add([Key(PROBE, operator.namespace, "after")], "test")
    deadline = time.monotonic() + 30
    while not ReconcileRecord.objects.filter(name="after").exists():
        assert time.monotonic() < deadline, (
            "the worker took no message after its acknowledgements failed",
            worker.log()[-5000:])
        assert worker.popen.poll() is None, worker.log()[-5000:]
        time.sleep(0.5)


def test_a_send_to_a_broker_that_stopped_answering_fails_in_bounded_time(
        toxiproxy, worker_db_url, namespace, tmp_path):
    """A broker that vanishes without closing the connection (failover, a NAT or firewall
    timeout; here a black hole that drops every byte) must not hold the sender - a watcher,
    a run, the reaper - forever: the send fails within the socket timeout, the key stays in
    the ledger, and the reaper sends it again once the broker is back."""
    from django.conf import settings

    redis_port = urllib.parse.urlsplit(settings.REDIS_URL).port
    through = _through(settings.REDIS_URL, toxiproxy.proxy("redis", redis_port))
    toxiproxy.add("redis", "black hole")
    script = (
        "import django; django.setup()\n"
        "from reconcilers._base.reconcile import Key\n"
        "from reconcilers._queue import workqueue\n"
        f"print('added', workqueue.add([Key({PROBE!r}, {namespace!r}, 'held')], 'test'))\n")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": worker_db_url,
           "REDIS_URL": through, "CELERY_BROKER_URL": through}
    started = time.monotonic()
    try:
        result = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO,
                                capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the send still waits after {exc.timeout} s") from None
    took = time.monotonic() - started
    assert "could not send" in result.stderr, result.stderr[-3000:]
    assert "added 1" in result.stdout, (result.stdout, result.stderr[-3000:])
    # Kept in the ledger, queued, for the reaper to send again.
    assert WorkItem.objects.get(reconciler=PROBE, namespace=namespace, name="held").state \
        == "queued"
    print(f"the send gave up after {took:.1f} s")


def test_a_worker_whose_every_slot_waits_on_a_frozen_database_fails_its_liveness_probe(
        operator, toxiproxy, worker_db_url):
    """A statement sent to a PostgreSQL that froze (its kernel still acknowledges the bytes:
    no TCP timeout ends the wait; a black hole that drops them, here) never returns. When
    every Celery thread of a thread-pool worker waits on one, the worker takes no message
    again while keys wait: it must fail its liveness probe, as a stalled consumer does, so
    that its orchestrator restarts it - not be taken for busy for ever."""
    from django.db import connection

    from reconcilers._base.reconcile import Key
    from reconcilers._queue import broker, workqueue

    db = urllib.parse.urlsplit(worker_db_url)
    port = free_port()
    operator.env.update({
        "OPERATOR_WORKER_HTTP_PORT": str(port), "RECONCILERS_WORKER_STALLED_AFTER": "3",
        "DATABASE_URL": _through(worker_db_url, toxiproxy.proxy("postgres", db.port))})
    operator.start_worker(concurrency=2, pool="threads")
    _wait(lambda: _status(port, "/healthz") == 200, 60)
    table = ReconcileRecord._meta.db_table

    def blocked() -> int:
        with connection.cursor() as cursor:  # a transaction reads one snapshot unless cleared
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                           "'Lock' AND query LIKE %s", [f"%{table}%"])
            return cursor.fetchone()[0]

    from django.db import transaction

    with transaction.atomic():  # both slots' pruning waits on this lock, on the server
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        for _ in range(2):
            broker.send_periodic("reconcilers.prune_history")
        deadline = time.monotonic() + 30
        while blocked() < 2:
            assert time.monotonic() < deadline, "the pruning never reached the database"
            time.sleep(0.2)
        toxiproxy.add("postgres", "black hole")  # their answers will be lost
    workqueue.add([Key(PROBE, operator.namespace, "waits")], "test")
    statuses = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and 503 not in statuses:
        statuses.append(_status(port, "/healthz"))
        time.sleep(1)
    assert statuses[-1] == 503, statuses
    toxiproxy.clear("postgres")

"""The web role's /healthz and /readyz (``_web.health``) against the real PostgreSQL, Redis and
api-server. (The watcher's and the worker's ``manage.py health``: tests/watch/test_health.py,
tests/run/test_health.py.)"""

from __future__ import annotations

import socket
import time

import pytest
from django.test import override_settings

from reconcilers._base import probes
from reconcilers._web import health as web


@pytest.fixture(autouse=True)
def _readiness_connection_closed():
    """Readiness keeps its PostgreSQL connection open: close it after each test, else the
    test database cannot be dropped."""
    yield
    probes.close_database()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db
def test_healthz_answers_ok_in_plain_text(client):
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert response.content == b"ok\n"


@pytest.mark.django_db
def test_readyz_is_ready_when_database_redis_and_apiserver_answer(client, stack):
    response = client.get("/readyz")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ready"
    assert set(body["checks"]) == {"database", "redis", "apiserver"}
    assert all(check["ok"] for check in body["checks"].values()), body


@pytest.mark.django_db
def test_readyz_answers_503_naming_redis_when_redis_is_unreachable(client, stack):
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{_closed_port()}/0"):
        response = client.get("/readyz")

    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unready"
    assert body["checks"]["redis"]["ok"] is False
    assert body["checks"]["redis"]["error"] == "ConnectionError"
    assert body["checks"]["database"]["ok"] and body["checks"]["apiserver"]["ok"], body


def test_a_database_that_accepts_but_never_answers_fails_the_check_within_its_timeout(
        stack, django_db_blocker):
    """A black-holed PostgreSQL (it accepts TCP, then says nothing) must not hang /readyz."""
    import socket
    import threading

    from django.db import connections

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def swallow() -> None:
        hole.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(hole.accept()[0])  # ...and never a byte back
            except OSError:
                continue

    threading.Thread(target=swallow, daemon=True).start()
    real = dict(connections.settings["default"])
    probes.close_database()  # the next check connects anew: to the hole
    connections.settings["default"].update(HOST="127.0.0.1", PORT=str(hole.getsockname()[1]))
    try:
        started = time.monotonic()
        with django_db_blocker.unblock():
            results = web.readiness(timeout=1.0)
        elapsed = time.monotonic() - started
    finally:
        connections.settings["default"].clear()
        connections.settings["default"].update(real)
        stop.set()
        for s in accepted:
            s.close()
        hole.close()
    assert results["database"].ok is False
    # Failed by its own bounded connect, not abandoned by the probe as a hung thread.
    assert results["database"].error == "OperationalError"
    assert results["redis"].ok and results["apiserver"].ok
    assert elapsed < 3.5
    time.sleep(1)
    assert not [t for t in threading.enumerate() if t.name.startswith("readyz")]
    probes.close_database()  # the database probe's own thread is free again (or this hangs)


@pytest.mark.django_db
def test_readyz_asks_over_the_same_postgresql_and_redis_connections_each_time(
        client, redis_client):
    """A probe every few seconds per replica must not open a PostgreSQL backend (nor a Redis
    connection) each time: the same ones answer every /readyz."""
    from django.db import connection

    def probe_connections() -> tuple[list[int], list[int]]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                           [probes._PROBE_APPLICATION])
            backends = sorted(row[0] for row in cursor.fetchall())
        clients = sorted(c["id"] for c in redis_client.client_list()
                         if c["name"] == probes._REDIS_NAME)
        return backends, clients

    assert client.get("/readyz").status_code == 200
    first = probe_connections()
    assert len(first[0]) == 1 and len(first[1]) == 1, first
    for _ in range(3):
        assert client.get("/readyz").status_code == 200
    assert probe_connections() == first

"""/healthz, /readyz and ``manage.py health`` against the real PostgreSQL, Redis, api-server and
a real Celery worker process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from reconcilers._base import probes
from reconcilers._run import health as worker_health
from reconcilers._watch import health as watcher
from reconcilers._web import health as web

REPO = Path(__file__).resolve().parents[2]


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


def _manage_health(*args: str) -> subprocess.CompletedProcess:
    from django.conf import settings

    env = {**os.environ, "REDIS_URL": settings.REDIS_URL}
    return subprocess.run([sys.executable, "manage.py", "health", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


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


def test_watcher_is_healthy_while_its_heartbeat_is_fresh(redis_client):
    pid = os.getpid()
    redis_client.hset(watcher.WATCHER_HEARTBEAT_KEY, watcher.watcher_field(pid) + ":0a1b2c3d", time.time())

    result = _manage_health("watcher", "--pid", str(pid))

    assert result.returncode == 0, result.stderr
    assert "watcher healthy" in result.stdout


def test_watcher_is_unhealthy_when_its_heartbeat_is_stale(redis_client):
    pid = os.getpid()
    redis_client.hset(watcher.WATCHER_HEARTBEAT_KEY, watcher.watcher_field(pid) + ":0a1b2c3d", time.time() - 120)

    result = _manage_health("watcher", "--pid", str(pid), "--max-age", "30")

    assert result.returncode != 0
    assert "s old (max 30s)" in result.stderr


def test_watcher_is_unhealthy_without_its_own_heartbeat(redis_client):
    # Another process's fresh heartbeat does not make this one healthy.
    redis_client.hset(watcher.WATCHER_HEARTBEAT_KEY, watcher.watcher_field(1) + ":0a1b2c3d", time.time())

    with pytest.raises(CommandError, match="no heartbeat from"):
        call_command("health", "watcher", "--pid", str(os.getpid()))


def test_the_worker_node_name_is_read_from_its_command_line():
    argv = ["/opt/venv/bin/python", "-m", "celery", "-A", "operator_project", "worker",
            "--hostname", "worker-1a2b3c4d@%h"]

    script = ["/opt/venv/bin/python", "/opt/venv/bin/celery", "-A", "x"]

    assert worker_health.worker_node(argv) == f"worker-1a2b3c4d@{socket.gethostname()}"
    assert worker_health.worker_node([*script, "worker"]) == f"celery@{socket.gethostname()}"
    assert worker_health.worker_node([*script, "beat"]) is None
    assert worker_health.worker_node(["/sbin/docker-init", "--", *script, "worker"]) is None
    assert worker_health.worker_node(["python", "manage.py", "health", "worker"]) is None


@pytest.mark.django_db(transaction=True)
def test_worker_is_healthy_while_it_answers_a_ping_and_unhealthy_once_stopped(celery_worker):
    worker = celery_worker()
    argv = Path(f"/proc/{worker.pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")
    node = worker_health.worker_node(argv)

    call_command("health", "worker", "--node", node)

    worker.stop()
    with pytest.raises(CommandError, match=f"no reply from {node}"):
        call_command("health", "worker", "--node", node, "--timeout", "1")


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

"""The database settings bound every wait on PostgreSQL, on real connections.

Without them a black-holed PostgreSQL (packets dropped, a host gone) holds a run, the reaper or
a leader's step-down for the kernel's TCP retransmission time - about 15 minutes - and a
statement stuck behind a lock holds them for ever.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import OperationalError, connection
from django.db.backends.postgresql.base import DatabaseWrapper

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db(transaction=True)


class BlackHole:
    """A TCP listener that accepts connections and never answers: a database host whose
    process hangs, or a proxy whose far side is gone."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.server.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.server.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def black_hole():
    hole = BlackHole()
    yield hole
    hole.close()


def test_connecting_to_a_database_that_never_answers_fails_within_connect_timeout(black_hole):
    params = dict(connection.settings_dict, HOST="127.0.0.1", PORT=str(black_hole.port))
    params["CONN_HEALTH_CHECKS"] = False
    wrapper = DatabaseWrapper(params, alias="blackhole")
    timeout = int(settings.DATABASES["default"]["OPTIONS"].get("connect_timeout", 5))
    outcome: list = []

    def connect() -> None:
        started = time.monotonic()
        try:
            wrapper.ensure_connection()
            outcome.append(("connected", time.monotonic() - started))
        except OperationalError:
            outcome.append(("refused", time.monotonic() - started))

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout + 5)
    assert not worker.is_alive(), f"still connecting after {timeout + 5} s"
    (result, elapsed), = outcome
    assert result == "refused" and elapsed < timeout + 3


def test_the_operators_connections_notice_a_dead_peer_in_about_30_seconds():
    """Keepalives notice a silent peer while a connection idles (a leader between renewals),
    ``tcp_user_timeout`` while a statement's bytes go unacknowledged: both give up in ~30 s."""
    connection.ensure_connection()
    dsn = dict(part.split("=", 1) for part in connection.connection.info.dsn.split())
    assert dsn["keepalives"] == "1"
    idle, interval, count = (int(dsn[k]) for k in
                             ("keepalives_idle", "keepalives_interval", "keepalives_count"))
    assert 20 <= idle + interval * count <= 40
    assert 20_000 <= int(dsn["tcp_user_timeout"]) <= 40_000
    assert 2 <= int(dsn["connect_timeout"]) <= 10


def _run_django(code: str, db_url: str, argv: list[str] | None = None,
                **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh process with the test settings and ``env``, as a worker starts."""
    prelude = (f"import sys; sys.argv = {argv or ['manage.py', 'shell']!r}\n"
               "import django; django.setup()\n"
               "from django.db import connection\n")
    return subprocess.run(
        [sys.executable, "-c", prelude + code], cwd=REPO, capture_output=True, text=True,
        timeout=60, env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
                         "DATABASE_URL": db_url, **env})


def test_a_statement_running_past_statement_timeout_is_cancelled(worker_db_url):
    started = time.monotonic()
    proc = _run_django(
        "from django.db import OperationalError\n"
        "try:\n"
        "    connection.cursor().execute('SELECT pg_sleep(8)')\n"
        "    print('finished')\n"
        "except OperationalError as exc:\n"
        "    print(type(exc.__cause__).__name__)\n",
        worker_db_url, DATABASE_STATEMENT_TIMEOUT="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "QueryCanceled"
    assert time.monotonic() - started < 7


def test_by_default_statements_are_bounded_but_migrate_is_not(worker_db_url):
    """A migration may rewrite a large table: ``migrate`` gets its own bound, none unless
    ``DATABASE_MIGRATE_STATEMENT_TIMEOUT`` says; it still waits for a lock no longer than a
    statement may run, since every statement on that table would queue behind it."""
    show = ("with connection.cursor() as c:\n"
            "    c.execute('SHOW statement_timeout'); print(c.fetchone()[0])\n"
            "    c.execute('SHOW lock_timeout'); print(c.fetchone()[0])\n")
    env = {"DATABASE_STATEMENT_TIMEOUT": "", "DATABASE_MIGRATE_STATEMENT_TIMEOUT": ""}
    worker = _run_django(show, worker_db_url, **env)
    assert worker.returncode == 0, worker.stderr
    assert worker.stdout.split() == ["1min", "0"]
    migrate = _run_django(show, worker_db_url, argv=["manage.py", "migrate"], **env)
    assert migrate.stdout.split() == ["0", "1min"], migrate.stderr
    bounded = _run_django(show, worker_db_url, argv=["manage.py", "migrate"],
                          DATABASE_MIGRATE_STATEMENT_TIMEOUT="600")
    assert bounded.stdout.split() == ["10min", "1min"], bounded.stderr


class Forwarder:
    """A TCP forwarder to PostgreSQL on a port of its own, so that a firewall rule can drop
    the packets of its connections alone: a network that black-holes a live connection."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client = self.server.accept()[0]
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()
        for s in self.sockets:  # the database's session ends with its connection
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def _wait_for_other_sessions_to_end(timeout: float = 10) -> None:
    """The forwarded session's backend ends a moment after its socket closes; the test
    database can only be dropped after."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND pid <> pg_backend_pid()")
            if cursor.fetchone()[0] == 0:
                return
        time.sleep(0.1)


def _iptables(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True)


@pytest.mark.slow
def test_a_live_connection_whose_network_drops_every_packet_fails_within_the_bound(
        worker_db_url):
    """The dead-peer bound, for real: packets to the database dropped (an iptables rule on a
    forwarder's own port) after the connection is made; the next statement's bytes are never
    acknowledged, and ``tcp_user_timeout`` ends the connection - not the kernel's ~15 minutes
    of retransmissions."""
    rule = ["INPUT", "-i", "lo", "-p", "tcp", "--dport", "{port}", "-j", "DROP"]
    probe = _iptables("-C", *[p.replace("{port}", "1") for p in rule])
    if "Permission denied" in probe.stderr or probe.returncode not in (0, 1):
        pytest.fail(f"iptables cannot be used here ({probe.stderr.strip()}); `make test` "
                    "installs it (hack/ensure-test-tools.sh) and runs as root", pytrace=False)
    s = connection.settings_dict
    forwarder = Forwarder((s["HOST"], int(s["PORT"])))
    url = worker_db_url.replace(f":{s['PORT']}/", f":{forwarder.port}/")
    code = ("import time\n"
            "from django.db import OperationalError\n"
            "connection.cursor().execute('SELECT 1'); print('ready', flush=True)\n"
            "sys.stdin.readline(); started = time.monotonic()\n"
            "try:\n"
            "    connection.cursor().execute('SELECT 1'); print('answered')\n"
            "except OperationalError as exc:\n"
            "    print('failed', round(time.monotonic() - started, 1))\n")
    prelude = ("import sys; sys.argv = ['manage.py', 'shell']\n"
               "import django; django.setup()\nfrom django.db import connection\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", prelude + code], cwd=REPO, text=True, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url,
             "DATABASE_DEAD_PEER_TIMEOUT": "4", "DATABASE_CONN_MAX_AGE": "600"})
    drop = [p.replace("{port}", str(forwarder.port)) for p in rule]
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        assert _iptables("-I", *drop).returncode == 0
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the statement still waits 30 s after the network went silent")
    finally:
        _iptables("-D", *drop)
        forwarder.close()
        _wait_for_other_sessions_to_end()
    verdict, *elapsed = out.split()
    assert verdict == "failed", (out, err)
    assert float(elapsed[0]) < 4 + 4

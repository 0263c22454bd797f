"""The bench's own PostgreSQL: PostgreSQL's durable defaults, as production runs it.

The local stack's PostgreSQL runs with ``fsync``, ``synchronous_commit`` and
``full_page_writes`` off (``reconcilers/devstack/services.py``): the tests do not measure, and
they are faster without waiting for the disk. The work ledger's durability is why this
project exists, so the bench pays for it: by default it starts a private PostgreSQL from the
same binaries on ``BENCH_POSTGRES_PORT`` (the stack's port + 2), with every durability setting
at PostgreSQL's default (on), and stops it when the run ends. Its data directory is kept for
the next run (``initdb`` once). A run given ``BENCH_DATABASE_URL`` (or a ``database_url``)
uses that server instead, as it is.

Whatever server a run used, ``durability`` reads its settings from the server itself
(``SHOW``), never from this module: the results files record what was measured.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from reconcilers.devstack import services
from reconcilers.devstack.process import port_open, read_pid, spawn, stop, wait_until

# The settings that make a commit survive a crash of the machine, as the server reports them.
DURABILITY_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes")
NAME = "bench-postgres"  # its pid file and log in the bench's scratch directory


@dataclass(frozen=True)
class OwnPostgres:
    """The private instance: where its data, pid file and log live, and its port."""

    port: int
    data_dir: Path
    run_dir: Path
    user: str
    password: str

    def url(self, database: str) -> str:
        return f"postgres://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    def pid(self) -> int | None:
        return read_pid(self.run_dir / f"{NAME}.pid")

    def start(self) -> None:
        """Start it (``initdb`` first if it has no data directory) and create the bench's
        role. One left running by a killed run of this scratch directory (one harness at a
        time uses it) is adopted; a server the bench did not start on its port is refused."""
        bindir = services.postgres_bindir()
        if bindir is None:
            raise SystemExit("PostgreSQL is not installed: the bench runs its own instance "
                             "from the stack's binaries (make up installs them)")
        os_user = "postgres" if os.geteuid() == 0 else None  # PostgreSQL refuses root
        if not (self.data_dir / "PG_VERSION").exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            if os_user:
                shutil.chown(self.data_dir, os_user, os_user)
            initdb = [str(bindir / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                      "--auth-local=trust", "--auth-host=trust", "-E", "UTF8",
                      "--locale=C.UTF-8"]
            subprocess.run((["runuser", "-u", os_user, "--"] if os_user else []) + initdb,
                           check=True, capture_output=True)
        if self.pid() is None:
            if port_open(self.port):
                raise SystemExit(f"port {self.port} is taken by a server the bench did not "
                                 "start; give the bench's PostgreSQL another port "
                                 "(BENCH_POSTGRES_PORT=...)")
            # No -c for fsync, synchronous_commit or full_page_writes: PostgreSQL's defaults
            # (all on) are the point of this instance.
            argv = [str(bindir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                    "-c", "listen_addresses=127.0.0.1",
                    "-c", f"unix_socket_directories={self.data_dir}",
                    "-c", "max_connections=200"]
            pid = spawn(NAME, argv, self.run_dir, self.run_dir, user=os_user)
            wait_until("the bench's PostgreSQL", lambda: self._sql("select 1") == "1", 60,
                       self.run_dir / f"{NAME}.log", pid)
        if self._sql(f"select 1 from pg_roles where rolname = '{self.user}'") != "1":
            self._sql(f"create role {self.user} login createdb password '{self.password}'")

    def stop(self) -> None:
        """SIGTERM to its process group: the postmaster's smart shutdown, every backend told
        to end (the bench's own processes have stopped by then); SIGKILL after 30 s."""
        stop(NAME, self.run_dir, timeout=30)

    def _sql(self, sql: str) -> str:
        bindir = services.postgres_bindir()
        out = subprocess.run([str(bindir / "psql"), "-h", "127.0.0.1", "-p", str(self.port),
                              "-U", "postgres", "-d", "postgres", "-tAc", sql],
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()


def own(stack, work_dir: Path) -> OwnPostgres:
    """The private instance of this scratch directory (its data outside the checkout when
    the ``postgres`` user could not reach the checkout's directory)."""
    port = int(os.environ.get("BENCH_POSTGRES_PORT", stack.postgres_port + 2))
    data = work_dir / "postgres"
    if os.geteuid() == 0 and subprocess.run(
            ["runuser", "-u", "postgres", "--", "test", "-x", str(work_dir)],
            capture_output=True).returncode != 0:
        data = Path("/var/tmp/django-crd-operator") / f"bench-postgres-{port}"
    return OwnPostgres(port, data, work_dir / "run", stack.db_user, stack.db_password)


def durability(database_url: str) -> dict:
    """The server's own durability settings (``SHOW``), and ``durable``: a commit survives a
    crash of the machine (``fsync`` and ``full_page_writes`` on, ``synchronous_commit`` not
    off)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        shown = {name: conn.execute(f"SHOW {name}").fetchone()[0]
                 for name in DURABILITY_SETTINGS}
        version = conn.execute("SHOW server_version").fetchone()[0]
    return {**shown, "server_version": version, "port": urlsplit(database_url).port,
            "durable": is_durable(shown)}


def is_durable(shown: dict) -> bool:
    return (shown.get("fsync") == "on" and shown.get("full_page_writes") == "on"
            and shown.get("synchronous_commit") not in (None, "off"))

"""PostgreSQL and Redis from Debian's packages, each a private instance on a loopback port."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .config import StackConfig
from .process import StartError, pid_alive, port_open, read_pid, spawn, stop, wait_until

APT_PACKAGES = {"postgres": "postgresql", "redis-server": "redis-server", "openssl": "openssl"}


def apt_install(*packages: str) -> None:
    """Install Debian packages once; ``apt-get update`` runs only when something is missing."""
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


def postgres_bindir() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=_pg_version)
    return Path(candidates[-1]).parent if candidates else None


def _pg_version(path: str) -> int:
    try:
        return int(Path(path).parent.parent.name)
    except ValueError:
        return 0


def ensure_packages() -> None:
    missing = []
    if postgres_bindir() is None:
        missing.append(APT_PACKAGES["postgres"])
    for binary in ("redis-server", "openssl"):
        if shutil.which(binary) is None:
            missing.append(APT_PACKAGES[binary])
    if missing:
        if os.geteuid() != 0:
            raise StartError(f"missing Debian packages {missing}: run as root or apt-get install them")
        apt_install(*missing)


# --- PostgreSQL ---------------------------------------------------------------------------


def _pg_user() -> str | None:
    """PostgreSQL refuses to run as root; as root we run it as Debian's ``postgres`` user."""
    return "postgres" if os.geteuid() == 0 else None


def pg_data_dir(cfg: StackConfig) -> Path:
    data = cfg.state_dir / "postgres"
    user = _pg_user()
    if user and subprocess.run(
        ["runuser", "-u", user, "--", "test", "-x", str(cfg.state_dir.parent)],
        capture_output=True,
    ).returncode != 0:
        # The checkout is not traversable by the postgres user (e.g. under /root).
        data = Path("/var/tmp/django-crd-operator") / f"postgres-{cfg.postgres_port}"
    return data


def _psql(cfg: StackConfig, sql: str, db: str = "postgres") -> str:
    bindir = postgres_bindir()
    assert bindir is not None
    argv = [
        str(bindir / "psql"), "-h", "127.0.0.1", "-p", str(cfg.postgres_port), "-U", "postgres",
        "-d", db, "-tAc", sql,
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def start_postgres(cfg: StackConfig) -> None:
    bindir = postgres_bindir()
    if bindir is None:
        raise StartError("PostgreSQL is not installed")
    data = pg_data_dir(cfg)
    user = _pg_user()
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, exist_ok=True)
        if user:
            shutil.chown(data, user, user)
        initdb = [
            str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth-local=trust",
            "--auth-host=trust", "-E", "UTF8", "--locale=C.UTF-8",
        ]
        if user:
            initdb = ["runuser", "-u", user, "--", *initdb]
        subprocess.run(initdb, check=True, capture_output=True)
    if read_pid(cfg.run_dir / "postgres.pid") is None and not port_open(cfg.postgres_port):
        for lock in (data / "postmaster.pid", data / f".s.PGSQL.{cfg.postgres_port}.lock"):
            _clear_stale_lock(lock)
        argv = [
            str(bindir / "postgres"), "-D", str(data), "-p", str(cfg.postgres_port),
            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={data}",
            # Local development and tests only: durability is not the point of this instance.
            "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            "-c", "max_connections=200",
        ]
        pid = spawn("postgres", argv, cfg.run_dir, cfg.log_dir, user=user)
        wait_until(
            "PostgreSQL", lambda: _psql(cfg, "select 1") == "1", 60,
            cfg.log_dir / "postgres.log", pid,
        )
    exists = _psql(cfg, f"select 1 from pg_roles where rolname = '{cfg.db_user}'")
    if exists != "1":
        _psql(
            cfg,
            f"create role {cfg.db_user} login createdb password '{cfg.db_password}'",
        )
    if _psql(cfg, f"select 1 from pg_database where datname = '{cfg.db_name}'") != "1":
        _psql(cfg, f"create database {cfg.db_name} owner {cfg.db_user}")


def _clear_stale_lock(lock: Path) -> None:
    """Remove a PostgreSQL lock file (the data directory's, the socket's) when its pid is held
    by a process that is not PostgreSQL.

    PostgreSQL removes the lock of a postmaster that died, but refuses to start while a
    process it may signal (one of its own user) holds the number in it; after a reset killed
    the stack, an unrelated one may.
    """
    try:
        pid = int(lock.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        program = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return  # gone: PostgreSQL clears the lock itself
    if program not in ("postgres", "postmaster"):
        lock.unlink(missing_ok=True)


def stop_postgres(cfg: StackConfig) -> bool:
    """A fast shutdown of the postmaster itself (every client cut off at once, no recovery
    needed at the next start), then the process that started it, if still there."""
    pidfile = pg_data_dir(cfg) / "postmaster.pid"
    try:
        postmaster = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        postmaster = None
    if postmaster is not None and pid_alive(postmaster):
        os.kill(postmaster, signal.SIGINT)
        deadline = time.monotonic() + 60
        while pid_alive(postmaster) and time.monotonic() < deadline:
            time.sleep(0.1)
    return stop("postgres", cfg.run_dir, timeout=30) or postmaster is not None


# --- Redis -----------------------------------------------------------------------------------


def start_redis(cfg: StackConfig) -> None:
    if read_pid(cfg.run_dir / "redis.pid") is not None or port_open(cfg.redis_port):
        return
    data = cfg.state_dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        "redis-server", "--port", str(cfg.redis_port), "--bind", "127.0.0.1",
        "--dir", str(data), "--daemonize", "no",
        # The work ledger in PostgreSQL is the durable part; Redis may lose everything.
        "--save", "", "--appendonly", "no",
    ]
    pid = spawn("redis", argv, cfg.run_dir, cfg.log_dir)
    wait_until("Redis", lambda: port_open(cfg.redis_port), 30, cfg.log_dir / "redis.log", pid)


def stop_redis(cfg: StackConfig) -> bool:
    return stop("redis", cfg.run_dir)

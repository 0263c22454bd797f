"""This project: ``manage.py watch`` + N Celery workers, as deployed.

The default layout (what ``make demo`` and compose run): each worker a thread pool of 8, the
leading watcher sending the periodic tasks. ``--pool prefork --concurrency 4 --beat`` is the
large-install layout (a process per concurrent run, a separate beat).

Run with ``DJANGO_SETTINGS_MODULE=bench.settings`` (the project's settings plus the bench-only
``BenchItem`` app), against the bench's own database and Redis db number, ``DEBUG`` off and
logging at WARNING (no per-task log lines - the peers log nothing per reconcile either).
Everything else is the project's defaults (``docs/running/configuration.md``), listed by
``describe()``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..config import REPO
from .base import Impl, Proc, compile_bytecode

RECONCILER = "benchitems.bench.operator.local"
TABLES = ("reconcilers_workitem", "reconcilers_reconcilerecord", "reconcilers_watchstream")


def _settings_env(cfg) -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "OPERATOR_ENV_FILE": "/nonexistent",  # nothing from .local/env: all set here
        "DATABASE_URL": cfg.database_url,
        "REDIS_URL": cfg.redis_url,
        "DEBUG": "0",
        "SECRET_KEY": "bench-only-not-secret",
        "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),  # INFO to debug a run
        "OPERATOR_SAMPLES": "0",
        # As compose and deploy/ run the watcher and the workers: without the admin's apps.
        "OPERATOR_SERVES_PAGES": "0",
        # A Lease of its own per bench database, so neither a dev watcher nor another bench
        # run (the smoke test's) competes with this one for leadership.
        "RECONCILERS_LEASE_NAME": "bench-" + urlsplit(cfg.database_url).path.lstrip("/")
                                  .replace("_", "-")[:50],
        # Opt-in experiments from the harness's own environment (see bench/settings.py).
        **{k: v for k, v in os.environ.items() if k.startswith("BENCH_EXPERIMENT_")},
        # ... and any operator setting: BENCH_EXPERIMENT_RECONCILERS_X=v sets RECONCILERS_X=v.
        **{k.removeprefix("BENCH_EXPERIMENT_"): v for k, v in os.environ.items()
           if k.startswith("BENCH_EXPERIMENT_RECONCILERS_")},
    }


def ensure_database(database_url: str) -> None:
    """Create the bench database when missing, then migrate it (a no-op when current)."""
    import psycopg

    url = urlsplit(database_url)
    name = url.path.lstrip("/")
    admin = url._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


@dataclass
class ThisProject(Impl):
    name: str = "this-project"
    workers: int = 1
    concurrency: int = 8
    pool: str = "threads"
    beat: bool = False
    debounce: float = 0.0  # Reconciler.debounce of the BenchItem reconciler (opt-in)
    supports_standby = True
    supports_scope = True
    services = ("postgres", "redis")  # the ledger and history; the cache and the broker

    def env(self, trace: Path, sleep_ms: int) -> dict[str, str]:
        return {**self.base_env(trace, sleep_ms), **_settings_env(self.cfg),
                "BENCH_DEBOUNCE": str(self.debounce),
                "RECONCILERS_WATCHER_SCHEDULES": "0" if self.beat else "1",
                "RECONCILERS_NAMESPACES": ",".join(self.scope)}

    def prepare(self) -> None:
        compile_bytecode(*(REPO / d for d in ("reconcilers", "operator_project", "migrations",
                                              "bench")))
        ensure_database(self.cfg.database_url)
        self._migrate()

    def _migrate(self) -> None:
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
                       cwd=REPO, env=self.env(Path("/dev/null"), 0), check=True)
        self._migrated_for = _migrations_state()

    def reset(self) -> None:
        """Empty ledger, history and stream rows, and the bench Redis db (cache and broker).

        Migrates again first if the project's migrations changed since the last run: the
        processes are started from the working tree, which may move during a long run."""
        import psycopg
        import redis

        if getattr(self, "_migrated_for", None) != _migrations_state():
            self._migrate()

        with psycopg.connect(self.cfg.database_url, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {', '.join(TABLES)}")
        r = redis.Redis.from_url(self.cfg.redis_url)
        r.flushdb()
        r.close()

    def run_version(self) -> str:
        return _git_version()

    def storage(self) -> dict:
        """The ledger's, the history's and the stream's tables with their indexes and TOAST
        (``pg_total_relation_size``), and Redis's ``used_memory`` (the instance's: the
        cache and the broker share it with whatever else uses that Redis)."""
        import psycopg
        import redis

        with psycopg.connect(self.cfg.database_url, autocommit=True) as conn:
            tables = {t: conn.execute("SELECT pg_total_relation_size(%s)", [t]).fetchone()[0]
                      for t in TABLES}
        r = redis.Redis.from_url(self.cfg.redis_url)
        try:
            used = int(r.info("memory")["used_memory"])
        finally:
            r.close()
        return {"postgres_tables_bytes": tables, "redis_used_memory": used}

    def start(self, trace: Path, sleep_ms: int = 0) -> None:
        env = self.env(trace, sleep_ms)
        py = sys.executable
        self.procs.append(self._watcher(env))
        for i in range(self.workers):
            self.procs.append(self.spawn(f"worker{i}", [
                py, "-m", "celery", "-A", "operator_project", "worker",
                "--pool", self.pool, "--concurrency", str(self.concurrency),
                "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
                "--hostname", f"bench{i}-{uuid.uuid4().hex[:4]}@%h"], env))
        if self.beat:
            self.procs.append(self.spawn("beat", [
                py, "-m", "celery", "-A", "operator_project", "beat", "--loglevel", "WARNING",
                "--schedule", str(self.cfg.work_dir / "beat-schedule")], env))

    def _watcher(self, env: dict[str, str]) -> Proc:
        return self.spawn("watcher", [sys.executable, "manage.py", "watch", RECONCILER], env)

    # The lines the watcher logs as it starts (``manage.py watch``: what it watches, then its
    # term as leader): the relist times them to show where a restart's time goes.
    startup_lines = ("watching ", "leading: starting streams")

    def restart_watcher(self, trace: Path, sleep_ms: int = 0) -> None:
        """The watcher alone stops and starts again (a watcher pod replaced), the workers
        running on: the cold start of the process that lists, fences and sends."""
        watcher = next(p for p in self.procs if p.name == "watcher")
        watcher.stop()
        self.procs.remove(watcher)
        self.procs.insert(0, self._watcher(self.env(trace, sleep_ms)))

    def process_log(self, name: str) -> Path:
        return self.logs() / f"{name}.log"

    def start_standby(self, trace: Path, sleep_ms: int = 0) -> None:
        """A second watcher campaigning for the Lease, as the cluster manifests run two."""
        env = {**self.env(trace, sleep_ms), "OPERATOR_WATCHER_HTTP_PORT": "0"}
        self.procs.append(self.spawn("standby", [sys.executable, "manage.py", "watch",
                                                 RECONCILER], env))

    def stop_leader(self) -> None:
        """The leading watcher stops cleanly (a rolling update's old pod); the standby, which
        watches the Lease, leads from its release on."""
        watcher = next(p for p in self.procs if p.name == "watcher")
        watcher.stop()
        self.procs.remove(watcher)
        standby = next(p for p in self.procs if p.name == "standby")
        standby.name = "watcher"

    def describe(self) -> dict:
        return {
            "name": self.name,
            "version": _git_version(),
            "processes": {"watcher": 1, "celery_workers": self.workers,
                          "concurrency_per_worker": self.concurrency,
                          "pool": self.pool, "beat": self.beat,
                          "periodic tasks sent by": "beat" if self.beat else "the leading watcher"},
            "settings": {
                "DJANGO_SETTINGS_MODULE": "bench.settings", "DEBUG": False,
                "LOG_LEVEL / celery --loglevel": "WARNING",
                "celery flags": "--without-gossip --without-mingle (as the tests run them)",
                "CELERY_TASK_ACKS_LATE": True, "CELERY_WORKER_PREFETCH_MULTIPLIER": 1,
                "reconciler": "predicates=[generation_changed], resync_period=0, "
                              "ctx.patch_status({'value': spec.value}) (merge patch with "
                              "resourceVersion; skipped when status already matches)",
                "RECONCILERS_*": "defaults (docs/running/configuration.md): leader election on "
                                 "(Lease 'bench-<database>'), LIST page 500, enqueue "
                                 "batch 1000, lease 60 s, reaper every 10 s",
                "database": "its own (operator_bench), CONN_MAX_AGE 60",
                "Reconciler.debounce": self.debounce,
                "redis": "its own db number (cache + broker)",
            },
        }


def _migrations_state() -> tuple:
    return tuple(sorted(
        str(p.relative_to(REPO))
        for d in (REPO / "migrations", REPO / "reconcilers" / "migrations")
        for p in d.glob("*.py")
    ))


def _git_version() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "reconcilers", "operator_project"],
                               cwd=REPO, capture_output=True, text=True).stdout.strip()
        return out + ("+uncommitted engine changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"

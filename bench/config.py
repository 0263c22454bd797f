"""Where the benchmark runs: the local stack, its private database and Redis db, its caches.

Everything a run needs to know about the machine comes from here, so the harness, the
implementations and the smoke test agree. The benchmark never touches dev or test data: it
uses its own PostgreSQL database (``BENCH_DATABASE_URL``, default ``operator_bench``) and its own
Redis db number (``BENCH_REDIS_URL``, default db 12). A harness run (``load(own_postgres=True)``)
puts that database on a PostgreSQL of its own with the durable defaults (``bench.postgres``)
unless ``BENCH_DATABASE_URL`` names a server. Venvs and binaries are cached outside the
repo under ``${OPERATOR_CACHE_DIR:-~/.cache/django-crd-operator}/bench``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
sys.path.insert(0, str(REPO))

from reconcilers.devstack import config as stack_config  # noqa: E402
from reconcilers.devstack.process import read_pid  # noqa: E402


def cache_root() -> Path:
    base = os.environ.get("OPERATOR_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "django-crd-operator")
    return Path(base) / "bench"


@dataclass(frozen=True)
class BenchConfig:
    stack: stack_config.StackConfig
    database_url: str
    redis_url: str
    work_dir: Path  # per-run scratch: traces, logs, schedules (outside the repo's tracked files)
    python: str = sys.executable
    env: dict = field(default_factory=dict)
    # The bench's private PostgreSQL (``bench.postgres``) when the database lives on it; None:
    # the database is on the stack's server (or the one BENCH_DATABASE_URL names).
    own_postgres: object = None

    @property
    def kubeconfig(self) -> Path:
        return self.stack.kubeconfig

    @property
    def apiserver(self) -> str:
        return f"https://127.0.0.1:{self.stack.apiserver_port}"

    @property
    def token(self) -> str:
        return (self.stack.pki_dir / "admin.token").read_text().strip()

    @property
    def ca_file(self) -> Path:
        return self.stack.pki_dir / "ca.crt"

    def stack_pids(self) -> dict[str, int]:
        """``{service: pid}`` of the local stack, from ``.local/run/*.pid``."""
        pids = {f.stem: read_pid(f) for f in sorted(self.stack.run_dir.glob("*.pid"))}
        if self.own_postgres is not None:
            # The PostgreSQL this run's database lives on is the one its figures count.
            pids["postgres"] = self.own_postgres.pid()
        return {name: pid for name, pid in pids.items() if pid is not None}

    def control_plane_bin(self) -> Path:
        for line in self.stack.env_file.read_text().splitlines():
            if line.startswith("OPERATOR_CONTROL_PLANE_BIN="):
                return Path(line.partition("=")[2])
        raise RuntimeError(f"OPERATOR_CONTROL_PLANE_BIN missing from {self.stack.env_file}")


def _db_url_default(stack: stack_config.StackConfig) -> str:
    return (f"postgres://{stack.db_user}:{stack.db_password}@127.0.0.1:{stack.postgres_port}"
            "/operator_bench")


def load(work_dir: Path | None = None, database_url: str | None = None,
         redis_url: str | None = None, own_postgres: bool = False) -> BenchConfig:
    """``own_postgres``: the bench database on the bench's durable PostgreSQL
    (``bench.postgres``; the caller starts it) unless a database URL is given."""
    stack = stack_config.load()
    work = work_dir or Path(os.environ.get("BENCH_WORK_DIR", REPO / ".local" / "bench"))
    work.mkdir(parents=True, exist_ok=True)
    database_url = database_url or os.environ.get("BENCH_DATABASE_URL")
    own = None
    if own_postgres and not database_url:
        from . import postgres

        own = postgres.own(stack, work)
        database_url = own.url("operator_bench")
    return BenchConfig(
        stack=stack,
        own_postgres=own,
        database_url=database_url or _db_url_default(stack),
        redis_url=redis_url or os.environ.get("BENCH_REDIS_URL")
        or f"redis://127.0.0.1:{stack.redis_port}/12",
        work_dir=work,
    )


def machine() -> dict:
    """What the numbers were measured on."""
    import platform

    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "memory_gib": round(mem_kb / 2**20, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "loadavg_at_start": list(os.getloadavg())}


def dump(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)

"""Results files: one per scenario of every harness run, kept for good.

``bench/results/<UTC start>-<mode>-<scenario>.json`` (e.g. ``2026-12-06T015800Z-full-converge.json``,
mode ``quick``, ``full`` or ``large``). A run never overwrites another: a name already taken
is refused. Beside its raw runs and summary, each file records what the figures depend on:
the project's version and git commit (and the measured paths with uncommitted changes), the
bench's arguments and plan, every implementation's settings, the machine, and every
environment override in force (``BENCH_*`` - ``BENCH_EXPERIMENT_*`` above all -,
``RECONCILERS_*``, ``CELERY_*``, ``GOMAXPROCS``), so ``bench.figures`` can group runs by
version and mode and keep experiments out of the headline. Two records decide which runs
belong together: ``project.engine``, a digest of the engine's source (every ``.py`` file of the
``reconcilers`` package as the run found it, committed or not), so a changed engine under an
unchanged version never pools its figures with the old one's; and ``durability``, the
PostgreSQL settings of the server the run's database lived on, read from that server
(``bench.postgres.durability``). A file without ``durability`` comes from the bench before it
paid for a durable ledger (fsync off): ``Run.durable`` is False.

Files written before this format (``<date>-[quick-|large-]<scenario>.json``, one per day, no
version) stay as they are; ``load`` reads them as runs of no recorded version.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from . import config, report

FORMAT = 2  # 1: the daily files before it (no "format" key)
OVERRIDE_PREFIXES = ("BENCH_", "RECONCILERS_", "CELERY_", "GOMAXPROCS")
# The sources a measured run executes: uncommitted changes here make a run differ from its commit.
# What a run measures: its results (and the history beside them) are not part of it.
MEASURED_PATHS = ("reconcilers", "operator_project", "migrations", "manage.py", "bench",
                  "pyproject.toml", ":(exclude)bench/results")
_SECRET_WORDS = ("PASSWORD", "SECRET", "TOKEN")
_MODES = {"full-large": "large"}  # the plan's mode -> the file name's


def mode_of(plan_mode: str) -> str:
    """``quick``, ``full`` or ``large``: the mode in file names and in the figures' groups."""
    return _MODES.get(plan_mode, plan_mode)


def overrides(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables in force that can change what the bench measures or how,
    with any password or token masked: results files are committed."""
    environ = os.environ if environ is None else environ
    return {k: _masked(k, v) for k, v in sorted(environ.items())
            if k.startswith(OVERRIDE_PREFIXES)}


def _masked(name: str, value: str) -> str:
    if any(word in name.upper() for word in _SECRET_WORDS):
        return "***"
    try:
        url = urlsplit(value)
    except ValueError:
        return value
    if url.password:
        host = url.hostname or ""
        netloc = f"{url.username}:***@{host}" + (f":{url.port}" if url.port else "")
        return url._replace(netloc=netloc).geturl()
    return value


# What a run of this project executes: the engine's package, the project's settings (connection
# reuse, prefetch, pool sizes) and the ledger's migrations (its indexes). Their source digest
# groups the runs.
ENGINE = ("reconcilers", "operator_project", "migrations")


def engine_digest(root: Path | None = None) -> str:
    """SHA-256 over the path and content of every ``.py`` file of the engine (``ENGINE``), in
    path order: equal exactly when the engine's source is. A commit would split runs over
    changes to docs or tests, and miss uncommitted changes to the engine."""
    root = root or config.REPO
    digest = hashlib.sha256()
    for path in sorted(p for part in ENGINE for p in (root / part).rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def project() -> dict:
    """The version (``pyproject.toml``), git commit and engine digest of the working tree the
    bench runs."""
    version = tomllib.loads((config.REPO / "pyproject.toml").read_text())["project"]["version"]
    commit, uncommitted = "unknown", []
    try:
        commit = _git("rev-parse", "HEAD").strip()
        uncommitted = [line[3:] for line in
                       _git("status", "--porcelain", "--", *MEASURED_PATHS).splitlines()]
    except (OSError, subprocess.CalledProcessError):
        pass
    return {"version": version, "commit": commit, "uncommitted": uncommitted,
            "engine": engine_digest()}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=config.REPO, check=True, capture_output=True,
                          text=True).stdout


def run_id(started: dt.datetime) -> str:
    """The harness run's id, its UTC start to the second: the prefix of its file names."""
    return started.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")


def write(results: dict[str, list[dict]], meta: dict, out_dir: Path) -> list[Path]:
    """One file per scenario: ``<out_dir>/<meta["run_id"]>-<mode>-<scenario>.json``.
    Raises ``FileExistsError`` rather than overwrite an earlier run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    mode = mode_of(meta["plan"]["mode"])
    paths = []
    for scenario, runs in results.items():
        path = out_dir / f"{meta['run_id']}-{mode}-{scenario}.json"
        body = {"format": FORMAT, "scenario": scenario, "mode": mode, **meta, "runs": runs,
                "summary": report.summarize(scenario, runs)}
        with open(path, "x") as f:  # "x": never overwrite
            f.write(config.dump(body) + "\n")
        paths.append(path)
    return paths


@dataclass
class Run:
    """One harness run, from its results files: ``scenarios`` maps a scenario to its raw
    repetitions (one result per implementation and repetition)."""

    run_id: str
    started_at: str
    mode: str
    version: str | None  # None: a file from before the version was recorded
    commit: str = ""
    uncommitted: list[str] = field(default_factory=list)
    plan: dict = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    scenarios: dict[str, list[dict]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    engine: str | None = None  # None: a file from before the engine's digest was recorded
    durability: dict | None = None  # None: from before it was recorded (a non-durable server)

    @property
    def durable(self) -> bool:
        """The run's ledger was durable: its server said so. A run without the record ran on
        the stack's PostgreSQL with fsync, synchronous_commit and full_page_writes off."""
        return bool(self.durability and self.durability.get("durable"))


def load(paths: list[Path]) -> list[Run]:
    """The harness runs in these results files, oldest first (files of one run joined)."""
    runs: dict[str, Run] = {}
    for path in sorted(paths):
        data = json.loads(Path(path).read_text())
        if data.get("format", 1) >= FORMAT:
            key = data["run_id"]
            proj = data.get("project", {})
            new = Run(key, data["started_at"], data["mode"], proj.get("version"),
                      proj.get("commit", ""), proj.get("uncommitted", []), data.get("plan", {}),
                      data.get("environment", {}), engine=proj.get("engine"),
                      durability=data.get("durability"))
        else:  # one daily file per scenario: its run is its start and its command
            key = f"{data['started_at']} {data.get('command', '')}"
            new = Run(data["started_at"], data["started_at"], mode_of(data["plan"]["mode"]),
                      None, plan=data.get("plan", {}))
        run = runs.setdefault(key, new)
        run.scenarios[data["scenario"]] = data["runs"]
        run.files.append(Path(path).name)
    return sorted(runs.values(), key=lambda r: (r.started_at, r.run_id))


def load_dir(directory: Path) -> list[Run]:
    return load(sorted(directory.glob("*.json")))

